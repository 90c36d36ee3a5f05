"""``podCacheSize`` against a model of llm-d's ``PodCache`` (an exact LRU of entries per key,
``pkg/kvcache/kvblock/in_memory.go``): every fast path of the index gives the model's answer."""

from __future__ import annotations

from collections import OrderedDict

from hypothesis import given, settings
from hypothesis import strategies as st

from ppc_extproc.index import InMemoryIndex, PodEntry

ENTRIES = [PodEntry(f"10.0.0.{i % 4}:8000", "gpu" if i < 4 else "", speculative=i >= 4) for i in range(6)]
ops = st.lists(
    st.tuples(
        st.sampled_from(["add", "add", "add", "evict"]),
        st.lists(st.integers(0, 40), min_size=1, max_size=40, unique=True),  # both paths: < and > 32 keys
        st.lists(st.integers(0, 5), min_size=1, max_size=3, unique=True),
    ),
    max_size=25,
)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 4), ops)
def test_index_matches_an_exact_lru_of_entries_per_key(limit: int, sequence) -> None:
    index = InMemoryIndex(size=10_000, pod_cache_size=limit)
    model: dict[int, OrderedDict[int, None]] = {}
    for op, keys, which in sequence:
        entries = [ENTRIES[i] for i in which]
        if op == "add":
            index.add(None, keys, entries)
            for key in keys:
                cache = model.setdefault(key, OrderedDict())
                for i in which:
                    cache[i] = None
                    cache.move_to_end(i)
                    while len(cache) > limit:
                        cache.popitem(last=False)
        else:
            index.evict_request_keys(keys, entries)
            for key in keys:
                for i in which:
                    model.get(key, OrderedDict()).pop(i, None)
        found = index.lookup(list(range(41)))
        expected = {k: {str(ENTRIES[i]) for i in c} for k, c in model.items() if c}
        assert {k: set(map(str, v)) for k, v in found.items()} == expected
