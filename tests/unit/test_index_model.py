"""Property test: the index behaves like a plain reference model over random operation sequences."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from ppc_extproc.index import EngineScope, InMemoryIndex, PodEntry, engine_to_request_mapping

ENDPOINTS = ["10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"]
entries = st.builds(
    PodEntry,
    st.sampled_from(ENDPOINTS),
    st.sampled_from(["gpu", "cpu", ""]),
    st.booleans(),
    st.sampled_from([None, 0]),
)
scopes = st.builds(EngineScope, st.sampled_from(ENDPOINTS), st.sampled_from([0, 1]), st.sampled_from([None, 0]))
request_keys = st.lists(st.integers(1, 12), min_size=1, max_size=5, unique=True)
engine_keys = st.lists(st.integers(1, 8), min_size=1, max_size=5, unique=True)


class ReferenceIndex:
    """The spec's semantics with sets and dicts, no bounds."""

    def __init__(self) -> None:
        self.keys: dict[int, set[PodEntry]] = {}
        self.engine: dict[tuple[EngineScope, int], list[int]] = {}

    def add(self, eks, rks, ents, scope) -> None:
        if eks:
            for e, mapped in engine_to_request_mapping(eks, rks):
                self.engine[(scope, e)] = list(mapped)
        for r in rks:
            self.keys.setdefault(r, set()).update(ents)

    def evict_engine(self, ek, scope, ents) -> None:
        mapped = self.engine.get((scope, ek))
        if mapped is None:
            return
        for r in mapped:
            self.evict_request(r, ents)
        if all(r not in self.keys for r in mapped):
            del self.engine[(scope, ek)]

    def evict_request(self, r, ents) -> None:
        held = self.keys.get(r)
        if held is not None:
            held.difference_update(ents)
            if not held:
                del self.keys[r]

    def clear(self, endpoint) -> None:
        for r in list(self.keys):
            self.evict_request(r, [e for e in self.keys[r] if e.endpoint == endpoint])

    def lookup(self, rks, endpoints) -> dict[int, set[PodEntry]]:
        out = {}
        for r in rks:
            held = {e for e in self.keys.get(r, ()) if not endpoints or e.endpoint in endpoints}
            if held:
                out[r] = held
        return out


class IndexMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.index = InMemoryIndex(size=10_000, pod_cache_size=100)
        self.model = ReferenceIndex()

    @rule(eks=st.one_of(st.none(), engine_keys), rks=request_keys, ents=st.lists(entries, min_size=1, max_size=2), scope=scopes)
    def add(self, eks, rks, ents, scope) -> None:
        self.index.add(eks, rks, ents, scope)
        self.model.add(eks, rks, ents, scope)

    @rule(ek=st.integers(1, 8), scope=scopes, ents=st.lists(entries, min_size=1, max_size=2))
    def evict_engine_key(self, ek, scope, ents) -> None:
        self.index.evict_engine_key(ek, scope, ents)
        self.model.evict_engine(ek, scope, ents)

    @rule(rks=request_keys, ents=st.lists(entries, min_size=1, max_size=2))
    def evict_request_keys(self, rks, ents) -> None:
        self.index.evict_request_keys(rks, ents)
        for r in rks:
            self.model.evict_request(r, ents)

    @rule(endpoint=st.sampled_from(ENDPOINTS))
    def clear(self, endpoint) -> None:
        self.index.clear(endpoint)
        self.model.clear(endpoint)

    @rule(endpoint=st.sampled_from(ENDPOINTS))
    def forget(self, endpoint) -> None:
        self.index.forget_endpoint(endpoint)
        self.model.clear(endpoint)

    @rule(rks=request_keys, endpoints=st.lists(st.sampled_from(ENDPOINTS), max_size=2))
    def lookup(self, rks, endpoints) -> None:
        got = {k: set(v) for k, v in self.index.lookup(rks, endpoints).items()}
        assert got == self.model.lookup(rks, set(endpoints))

    @rule(ek=st.integers(1, 8), scope=scopes)
    def get_request_key(self, ek, scope) -> None:
        mapped = self.model.engine.get((scope, ek))
        assert self.index.get_request_key(ek, scope) == (mapped[-1] if mapped else None)

    @invariant()
    def same_keys(self) -> None:
        assert len(self.index) == len(self.model.keys)


IndexMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)
TestIndexAgainstModel = IndexMachine.TestCase
