"""``podCacheSize`` against a model of llm-d's ``PodCache`` (an exact LRU of entries per key,
``pkg/kvcache/kvblock/in_memory.go``): every fast path of the index gives the model's answer,
through every write and removal path (request keys, engine keys, endpoint clears)."""

from __future__ import annotations

from collections import OrderedDict

from hypothesis import given, settings
from hypothesis import strategies as st

from ppc_extproc.ids import EngineKey, RequestKey
from ppc_extproc.index import EngineScope, InMemoryIndex, PodEntry

ENTRIES = [PodEntry(f"10.0.0.{i % 4}:8000", "gpu" if i < 4 else "", speculative=i >= 4) for i in range(6)]
SCOPE = EngineScope(ENTRIES[0].endpoint)
ops = st.lists(
    st.tuples(
        st.sampled_from(["add", "add", "add", "add_engine", "evict", "evict_engine", "clear"]),
        st.lists(st.integers(0, 40), min_size=1, max_size=40, unique=True),  # both paths: < and > 32 keys
        st.lists(st.integers(0, 5), min_size=1, max_size=3, unique=True),
    ),
    max_size=25,
)


@settings(max_examples=400, deadline=None)
@given(st.integers(1, 4), ops)
def test_index_matches_an_exact_lru_of_entries_per_key(limit: int, sequence) -> None:
    index = InMemoryIndex(size=10_000, pod_cache_size=limit)
    model: dict[int, OrderedDict[int, None]] = {}
    for op, keys, which in sequence:
        entries = [ENTRIES[i] for i in which]
        if op in ("add", "add_engine"):
            if op == "add":
                index.add(None, keys, entries)
            else:  # engine key k + 1000 -> request key k, in one endpoint's scope
                engine = [EngineKey(k + 1000) for k in keys]
                index.add(engine, [RequestKey(k) for k in keys], entries, scope=SCOPE)
            for key in keys:
                cache = model.setdefault(key, OrderedDict())
                for i in which:
                    cache[i] = None
                    cache.move_to_end(i)
                    while len(cache) > limit:
                        cache.popitem(last=False)
        elif op == "clear":
            endpoint = ENTRIES[which[0]].endpoint
            index.clear(endpoint)
            for cache in model.values():
                for i in [i for i in cache if ENTRIES[i].endpoint == endpoint]:
                    del cache[i]
        else:
            if op == "evict":
                index.evict_request_keys(keys, entries)
                evicted = keys
            else:  # only keys whose engine mapping is still there lose entries
                evicted = [k for k in keys if index.evict_engine_key(EngineKey(k + 1000), SCOPE, entries)]
            for key in evicted:
                for i in which:
                    model.get(key, OrderedDict()).pop(i, None)
        found = index.lookup(list(range(41)))
        expected = {k: {str(ENTRIES[i]) for i in c} for k, c in model.items() if c}
        assert {k: set(map(str, v)) for k, v in found.items()} == expected
