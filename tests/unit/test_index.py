"""Index semantics, ported from llm-d's ``testCommonIndexBehavior`` plus our own fixes."""

from __future__ import annotations

import pytest

from ppc_extproc.index import EngineScope, InMemoryIndex, PodEntry

A = PodEntry("10.0.0.1:8000", "gpu")
A_CPU = PodEntry("10.0.0.1:8000", "cpu")
A_GROUP = PodEntry("10.0.0.1:8000", "gpu", group=0)
B = PodEntry("10.0.0.2:8000", "gpu")
SA = EngineScope("10.0.0.1:8000")
SB = EngineScope("10.0.0.2:8000")


def test_one_to_one_mapping_and_lookup() -> None:
    index = InMemoryIndex(size=100)
    index.add([11, 12], [101, 102], [A], SA)
    assert index.lookup([101, 102]) == {101: [A], 102: [A]}
    assert index.get_request_key(11, SA) == 101
    assert index.get_request_key(12, SA) == 102


def test_many_to_one_mapping_evicts_eagerly() -> None:
    index = InMemoryIndex(size=100)
    index.add([1, 2, 3, 4, 5, 6, 7, 8], [100, 200], [A], SA)
    assert index.get_request_key(4, SA) == 100 and index.get_request_key(5, SA) == 200
    index.evict_engine_key(2, SA, [A])  # any of E0..E3 removes R0 for this pod
    assert index.lookup([100, 200]) == {200: [A]}


def test_one_to_many_mapping_returns_last_request_key() -> None:
    index = InMemoryIndex(size=100)
    index.add([1, 2], [10, 11, 12, 13], [A], SA)
    assert index.get_request_key(1, SA) == 11
    assert index.get_request_key(2, SA) == 13


def test_grouped_and_ungrouped_entries_are_distinct() -> None:
    index = InMemoryIndex(size=100)
    index.add(None, [5], [A])
    index.add(None, [5], [A_GROUP])
    assert sorted(map(str, index.lookup([5])[5])) == ["10.0.0.1:8000@gpu", "10.0.0.1:8000@gpu[group=0]"]
    index.evict_request_keys([5], [A_GROUP])
    assert index.lookup([5]) == {5: [A]}


def test_evict_keeps_the_mapping_while_another_tier_holds_the_block() -> None:
    index = InMemoryIndex(size=100)
    index.add([1], [10], [A], SA)
    index.add([1], [10], [A_CPU], SA)
    index.evict_engine_key(1, SA, [A])
    assert index.lookup([10]) == {10: [A_CPU]}
    assert index.get_request_key(1, SA) == 10
    index.evict_engine_key(1, SA, [A_CPU])
    assert index.lookup([10]) == {}
    assert index.get_request_key(1, SA) is None


def test_evict_unknown_engine_key_is_a_noop() -> None:
    index = InMemoryIndex(size=100)
    index.add([1], [10], [A], SA)
    assert index.evict_engine_key(99, SA, [A]) is False
    assert index.lookup([10]) == {10: [A]}


def test_empty_arguments_are_errors() -> None:
    index = InMemoryIndex(size=100)
    with pytest.raises(ValueError):
        index.add([1], [10], [], SA)
    with pytest.raises(ValueError):
        index.add([1], [], [A], SA)
    with pytest.raises(ValueError):
        index.evict_engine_key(1, SA, [])
    with pytest.raises(ValueError):
        index.lookup([])


def test_clear_removes_every_tier_of_one_endpoint_only() -> None:
    index = InMemoryIndex(size=100)
    spec = PodEntry("10.0.0.1:8000", "", speculative=True)
    index.add([1], [10], [A, A_CPU, spec], SA)
    index.add([1], [10], [B], SB)
    index.add(None, [20], [A])
    assert index.clear("10.0.0.1:8000") == 2
    assert index.lookup([10, 20]) == {10: [B]}
    # engine mappings stay (self-heal through LRU): a re-store chains as before
    assert index.get_request_key(1, SA) == 10


def test_lookup_filters_by_endpoint_and_skips_absent_keys() -> None:
    index = InMemoryIndex(size=100)
    index.add(None, [1, 3], [A])
    index.add(None, [1, 2, 3], [B])
    assert index.lookup([1, 2, 3, 4], ["10.0.0.1:8000"]) == {1: [A], 3: [A]}
    assert index.lookup([1, 2], []) == {1: [A, B], 2: [B]}


def test_engine_keys_are_scoped_per_endpoint() -> None:
    """Two pods reporting the same engine hash must not overwrite each other (llm-d bug B3)."""
    index = InMemoryIndex(size=100)
    index.add([7], [70], [A], SA)
    index.add([7], [71], [B], SB)
    assert index.get_request_key(7, SA) == 70
    assert index.get_request_key(7, SB) == 71
    index.evict_engine_key(7, SB, [B])
    assert index.lookup([70, 71]) == {70: [A]}


def test_engine_keys_are_scoped_per_rank_and_group() -> None:
    index = InMemoryIndex(size=100)
    index.add([7], [70], [A], EngineScope("10.0.0.1:8000", dp_rank=0))
    index.add([7], [71], [A], EngineScope("10.0.0.1:8000", dp_rank=1))
    assert index.get_request_key(7, EngineScope("10.0.0.1:8000", dp_rank=1)) == 71
    assert index.get_request_key(7, EngineScope("10.0.0.1:8000", group=3)) is None


def test_duplicate_store_is_reported() -> None:
    index = InMemoryIndex(size=100)
    assert index.add([1, 2], [10, 11], [A], SA) == []
    assert index.add([2], [11], [A], SA) == [2]
    assert index.add([2], [11], [A_CPU], SA) == []  # another tier is not a duplicate


def test_size_bound_evicts_least_recently_used_keys() -> None:
    index = InMemoryIndex(size=10)
    index.add(None, list(range(5)), [A])  # generation 1 (capacity 10 → 5 per generation)
    index.lookup([0])  # touch key 0: it survives the next capacity/2 insertions
    index.add(None, list(range(100, 105)), [A])
    assert 0 in index.lookup([0])
    assert index.lookup([1, 2, 3, 4]) == {}
    assert index.stats().evicted_request_keys == 4
    index.add(None, list(range(200, 300)), [A])
    assert len(index) <= 10


def test_engine_mappings_are_bounded_too() -> None:
    index = InMemoryIndex(size=10)
    for i in range(100):
        index.add([i], [1000 + i], [A], SA)
    assert index.stats().engine_keys <= 10


def test_pod_cache_size_evicts_the_least_recently_added_entry() -> None:
    """llm-d's ``PodCache`` is an LRU of entries (``pkg/kvcache/kvblock/in_memory.go``)."""
    index = InMemoryIndex(size=100, pod_cache_size=2)
    c = PodEntry("10.0.0.3:8000", "gpu")
    index.add(None, [9], [A, B, c])  # registers A, B, c in bit order
    index.add(None, [1], [B])
    index.add(None, [1], [A])
    index.add(None, [1], [c])  # B is the oldest on key 1, though A was registered first
    assert sorted(e.endpoint for e in index.lookup([1])[1]) == ["10.0.0.1:8000", "10.0.0.3:8000"]
    assert sorted(e.endpoint for e in index.lookup([9])[9]) == ["10.0.0.2:8000", "10.0.0.3:8000"]


@pytest.mark.parametrize("bulk", [False, True])
def test_re_adding_an_entry_refreshes_it(bulk: bool) -> None:
    index = InMemoryIndex(size=1000, pod_cache_size=2)
    keys = list(range(1, 101 if bulk else 3))  # > 32 keys take the bulk path
    c = PodEntry("10.0.0.3:8000", "gpu")
    index.add(None, keys, [A])
    index.add(None, keys, [c])
    index.add(None, keys, [A])  # A is now newer than c
    index.add(None, keys, [B])
    found = index.lookup(keys)
    assert all(sorted(map(str, found[k])) == sorted(map(str, [A, B])) for k in keys)


def test_pod_cache_size_drops_a_speculative_entry_like_any_other() -> None:
    """llm-d's ``PodCache`` does not tell speculative entries apart: the least recent goes."""
    index = InMemoryIndex(size=100, pod_cache_size=2)
    spec = PodEntry("10.0.0.3:8000", "", speculative=True)
    index.add(None, [1], [A])
    index.add(None, [1], [spec])
    index.add(None, [1], [B])
    assert sorted(map(str, index.lookup([1])[1])) == sorted(map(str, [spec, B]))


def test_entries_removed_since_do_not_count_towards_pod_cache_size() -> None:
    index = InMemoryIndex(size=100, pod_cache_size=2)
    spec = PodEntry("10.0.0.3:8000", "", speculative=True)
    index.add(None, [1], [A])
    index.add(None, [1], [spec])
    index.evict_request_keys([1], [spec])
    index.add(None, [1], [B])
    index.add(None, [1], [spec])  # A is the oldest entry still held
    assert sorted(map(str, index.lookup([1])[1])) == sorted(map(str, [B, spec]))


@pytest.mark.parametrize("bulk", [False, True])
def test_an_add_can_replace_entries_in_the_same_write(bulk: bool) -> None:
    """A confirmed entry supersedes the speculative one; keys without it, and the order of what
    is left (``podCacheSize``), are as if it had been evicted first."""
    index = InMemoryIndex(size=1000, pod_cache_size=2)
    spec = PodEntry("10.0.0.1:8000", "", speculative=True)
    keys = list(range(1, 101 if bulk else 4))  # > 32 keys take the bulk path
    index.add(None, keys[:-1], [spec])
    index.add(None, keys[:1], [B])
    index.add([1000 + k for k in keys], keys, [A], SA, replacing=[spec])
    found = index.lookup(keys)
    assert sorted(map(str, found[keys[0]])) == sorted(map(str, [A, B]))
    assert all(found[k] == [A] for k in keys[1:])
    assert index.lookup(keys, ["10.0.0.1:8000"]) == {k: [A] for k in keys}
    index.add(None, keys[:1], [PodEntry("10.0.0.3:8000", "gpu")])  # B is the oldest: it goes
    assert sorted(e.endpoint for e in index.lookup(keys[:1])[keys[0]]) == ["10.0.0.1:8000", "10.0.0.3:8000"]


def test_forget_endpoint_recycles_entry_bits() -> None:
    index = InMemoryIndex(size=100)
    index.add(None, [1], [A])
    index.add(None, [1], [B])
    index.forget_endpoint("10.0.0.1:8000")
    c = PodEntry("10.0.0.3:8000", "gpu")
    index.add(None, [2], [c])  # reuses A's bit; must not resurrect A anywhere
    assert index.lookup([1, 2]) == {1: [B], 2: [c]}
    assert len(index.registry) == 2


def test_prefix_runs_stop_where_no_candidate_extends_its_prefix() -> None:
    index = InMemoryIndex(size=100)
    index.add(None, [1, 2, 3], [A])
    index.add(None, [1, 2], [B])
    index.add(None, [4, 5], [B])  # B never held 3, so 4 and 5 cannot count
    runs = index.prefix_runs([1, 2, 3, 4, 5])
    assert [(sorted(r.info.weights), r.count) for r in runs] == [
        (["10.0.0.1:8000", "10.0.0.2:8000"], 2),
        (["10.0.0.1:8000"], 1),
    ]
    assert index.prefix_runs([1, 2, 3], ["10.0.0.9:8000"]) == []
