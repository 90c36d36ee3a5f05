"""``native.U64Map`` (the C table of the index's generations) behaves like a dict on the subset the
LRU uses, and the LRU gives the same results on it as on dicts; values are reference-counted and
collected; keys outside [0, 2^64) are refused."""

from __future__ import annotations

import gc
import sys
import weakref
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ppc_extproc import native
from ppc_extproc.index.lru import TwoGenerationLRU, default_table

pytestmark = pytest.mark.skipif(native.U64Map is None, reason="the C extension is not built")
U64Map: Any = native.U64Map

# Few distinct small keys (dense runs, collisions, deletions inside runs) and full-range ones.
KEYS = st.one_of(st.integers(0, 40), st.integers(0, 2**64 - 1), st.sampled_from([0, 2**63, 2**64 - 1]))
VALUES = st.integers(0, 6)
TABLE_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("set"), KEYS, VALUES),
        st.tuples(st.just("del"), KEYS),
        st.tuples(st.just("pop"), KEYS),
        st.tuples(st.just("get"), KEYS),
        st.tuples(st.just("popitem")),
        st.tuples(st.just("update"), st.dictionaries(KEYS, VALUES, max_size=12), st.sampled_from(["dict", "pairs", "table"])),
        st.tuples(st.just("fill"), st.lists(KEYS, max_size=12), VALUES),
        st.tuples(st.just("get_many"), st.lists(KEYS, max_size=12)),
        st.tuples(st.just("copy")),
        st.tuples(st.just("clear")),
    ),
    max_size=120,
)


@settings(max_examples=200, deadline=None)
@given(TABLE_OPS)
def test_the_table_behaves_like_a_dict(ops: list[tuple[Any, ...]]) -> None:
    table, model = U64Map(), {}
    for op, *args in ops:
        if op == "set":
            table[args[0]] = args[1]
            model[args[0]] = args[1]
        elif op == "del":
            if args[0] in model:
                del table[args[0]]
                del model[args[0]]
            else:
                with pytest.raises(KeyError):
                    del table[args[0]]
        elif op == "pop":
            assert table.pop(args[0], None) == model.pop(args[0], None)
        elif op == "get":
            assert table.get(args[0]) == model.get(args[0])
            assert (args[0] in table) == (args[0] in model)
        elif op == "popitem":
            if model:
                key, value = table.popitem()
                assert model.pop(key) == value
            else:
                with pytest.raises(KeyError):
                    table.popitem()
        elif op == "update":
            source, form = args
            table.update(source if form == "dict" else list(source.items()) if form == "pairs" else U64Map(source))
            model.update(source)
        elif op == "fill":
            table.fill(args[0], args[1])
            model.update(dict.fromkeys(args[0], args[1]))
        elif op == "get_many":
            assert table.get_many(args[0]) == [model.get(k) for k in args[0]]
        elif op == "copy":
            copy = table.copy()
            table.clear()
            assert len(table) == 0
            table = copy
        else:
            table.clear()
            model.clear()
        assert len(table) == len(model)
    assert dict(table) == model
    assert sorted(table.keys()) == sorted(model) == sorted(table)
    assert sorted(table.items()) == sorted(model.items())
    assert sorted(table.values()) == sorted(model.values())


def _or(bits: int) -> Callable[[int | None], int]:
    return lambda mask: bits if mask is None else mask | bits


LRU_KEYS = st.lists(st.one_of(st.integers(0, 150), st.integers(2**63, 2**63 + 5)), min_size=1, max_size=70, unique=True)
LRU_OPS = st.lists(
    st.tuples(
        st.sampled_from(["set", "set_many", "set_many_salted", "or", "get", "get_prefix_runs", "and_not", "update_many", "pop", "replace", "peek"]),
        LRU_KEYS,
        st.integers(1, 7),
    ),
    max_size=40,
)


def _state(lru: TwoGenerationLRU[int, int]) -> tuple[Any, ...]:
    # Which evicted items are released first differs (a dict pops its last, the table any): only
    # how many are pending counts.
    return (dict(lru._young), dict(lru._old), lru.retired_items(), lru.evicted, len(lru), sorted(lru.items()))


@settings(max_examples=150, deadline=None)
@given(st.integers(2, 90), LRU_OPS)
def test_the_lru_gives_the_same_results_on_tables_and_on_dicts(capacity: int, ops: list[tuple[str, list[int], int]]) -> None:
    """Every operation, through generation rotations and the release of evicted generations."""
    lrus: list[TwoGenerationLRU[int, int]] = [TwoGenerationLRU(capacity, dict), TwoGenerationLRU(capacity, U64Map)]
    for op, keys, bits in ops:
        results = []
        for lru in lrus:
            if op == "set":
                results.append([lru.set(k, bits) for k in keys])
            elif op == "set_many":
                results.append(lru.set_many(keys, [bits] * len(keys)))
            elif op == "set_many_salted":  # scoped engine keys: (key ^ salt) mod 2^64, negatives too
                salted = [k - 75 for k in keys]
                results.append(lru.set_many(salted, list(range(len(keys))), salt=(2**64 - 1) ^ bits))
            elif op == "or":
                results.append(lru.or_bits(keys, _or(bits)))
            elif op == "get":
                results.append([lru.get(k) for k in keys])
            elif op == "get_prefix_runs":
                results.append(lru.get_prefix_runs(keys))
            elif op == "and_not":
                results.append(lru.and_not_bits(keys, bits))
            elif op == "update_many":
                results.append(lru.update_many(keys, [bits] * len(keys)))
            elif op == "pop":
                results.append([lru.pop(k) for k in keys[:3]])
            elif op == "replace":
                results.append([lru.replace(k, bits) for k in keys[:3] if k in lru])
            else:
                results.append([lru.peek(k) for k in keys])
        assert results[0] == results[1]
        assert _state(lrus[0]) == _state(lrus[1])
    copies = [[dict(t.items()) for t in lru.copy_items()] for lru in lrus]
    assert copies[0] == copies[1]


SWAP_KEYS = st.lists(st.one_of(st.integers(-3, 40), st.integers(2**64 - 3, 2**64 + 3)), max_size=40)


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(st.integers(0, 40), VALUES, max_size=20),
    st.dictionaries(st.integers(0, 40), VALUES, max_size=20),
    SWAP_KEYS,
    st.integers(0, 45),
    st.integers(0, 50),
    st.sampled_from([0, 1, 2**64 - 1, 2**63 + 7]),
    st.booleans(),
)
def test_swap_many_equals_a_loop_of_gets_pops_and_sets(
    young_items: dict[int, int], old_items: dict[int, int], keys: list[int], start: int, limit: int, salt: int,
    with_old: bool,
) -> None:
    """What the LRU's set_many did key by key: previous value (young's, else popped from old), the
    write, a stop after the write that reaches ``limit``; keys taken mod 2^64 then XORed with salt."""
    young, old = U64Map(young_items), U64Map(old_items)
    model_young, model_old = dict(young_items), dict(old_items)
    values = list(range(100, 100 + len(keys)))
    previous: list[int | None] = []
    stop, found = young.swap_many(keys, values, start, old if with_old else None, limit, salt, previous)
    expected: list[int | None] = []
    i = start
    while i < len(keys):
        key = (keys[i] % 2**64) ^ salt
        before = model_young.get(key)
        if before is None and with_old:
            before = model_old.pop(key, None)
        expected.append(before)
        model_young[key] = values[i]
        i += 1
        if len(model_young) >= limit:
            break
    assert (stop, found) == (max(i, start), sum(v is not None for v in expected))
    assert previous == expected
    assert dict(young) == model_young and dict(old) == model_old


@given(st.dictionaries(KEYS, VALUES, max_size=30), st.integers(0, 40))
def test_drop_some_removes_what_popitem_would(items: dict[int, int], n: int) -> None:
    table, twin = U64Map(items), U64Map(items)
    assert table.drop_some(n) == min(n, len(items))
    for _ in range(min(n, len(items))):
        twin.popitem()
    assert dict(table) == dict(twin)


def test_the_lru_uses_the_table_when_the_extension_is_built() -> None:
    assert default_table() is U64Map
    assert isinstance(TwoGenerationLRU(10)._young, U64Map)


class Value:
    """An object value that can be watched (ints are shared)."""


def test_values_are_released_with_the_table_and_by_every_removal() -> None:
    table = U64Map()
    held = [Value() for _ in range(6)]
    refs = [weakref.ref(v) for v in held]
    for i in range(6):
        table[i] = held[i]
    copy = table.copy()
    assert [sys.getrefcount(held[i]) for i in range(6)] == [4] * 6  # held, table, copy, the argument
    same = table.pop(0) is held[0]
    assert same
    del table[1]
    table[2] = "other"
    key, value = table.popitem()
    del key, value
    copy.clear()
    counts = [sys.getrefcount(held[i]) for i in range(6)]
    assert counts[:3] == [2, 2, 2] and sorted(counts[3:]) == [2, 3, 3], counts  # 3 to 5: one popped
    del table, copy
    assert [sys.getrefcount(held[i]) for i in range(6)] == [2] * 6
    del held
    assert all(r() is None for r in refs)


def test_a_cycle_through_a_table_is_collected() -> None:
    table = U64Map()
    value = Value()
    table[7] = [table, value]  # table -> list -> table
    ref = weakref.ref(value)
    gc.collect()
    assert gc.is_tracked(table)
    del table, value
    gc.collect()
    assert ref() is None


def test_bulk_calls_keep_reference_counts() -> None:
    young, old = U64Map(), U64Map()
    value = Value()
    old.fill(list(range(100)), value)
    before = sys.getrefcount(value)
    values, done = native.dict_prefix(young, old, list(range(150)), 1000)  # promotes 100 keys
    assert done and len(values) == 100 and len(young) == 100 and len(old) == 0
    assert sys.getrefcount(value) == before + 100  # the returned list's references
    del values
    assert sys.getrefcount(value) == before
    new = Value()
    assert native.remap(young, list(range(50)), [value] * 50, {value: new}) == 50
    assert native.remap(young, list(range(50, 100)), [value] * 50, {value: None}) == 50
    assert len(young) == 50 and sys.getrefcount(value) == before - 100 and sys.getrefcount(new) == 52
    young.clear()
    assert sys.getrefcount(new) == 2


def test_a_promotion_that_fills_the_young_generation_stops_there() -> None:
    young, old = U64Map(), U64Map({1: 5, 2: 6, 3: 7})
    young[9] = 1
    assert native.dict_prefix(young, old, [1, 2, 3], 2) == ([5], False)
    assert dict(young) == {9: 1, 1: 5} and dict(old) == {2: 6, 3: 7}
    with pytest.raises(TypeError):
        native.dict_prefix(young, {}, [1], 10)  # a table and a dict


@pytest.mark.parametrize("key, error", [(-1, OverflowError), (2**64, OverflowError), (-(2**70), OverflowError),
                                        (1.0, TypeError), ("1", TypeError), (None, TypeError)])  # fmt: skip
def test_keys_outside_the_uint64_range_are_refused(key: object, error: type[Exception]) -> None:
    table = U64Map({1: 1})
    for call in (
        lambda: table.__setitem__(key, 1), lambda: table[key], lambda: key in table, lambda: table.get(key),
        lambda: table.pop(key, None), lambda: table.__delitem__(key), lambda: table.fill([key], 1),
        lambda: table.update([(key, 1)]), lambda: table.get_many([key]),
        lambda: native.dict_prefix(table, U64Map(), [key], 10), lambda: native.remap(table, [key], [1], {1: 2}),
    ):  # fmt: skip
        with pytest.raises(error):
            call()
    assert dict(table) == {1: 1}


def test_missing_keys_and_malformed_updates_raise_like_a_dict() -> None:
    table = U64Map()
    with pytest.raises(KeyError):
        table[3]
    with pytest.raises(KeyError):
        table.pop(3)
    with pytest.raises(KeyError):
        table.popitem()
    with pytest.raises(ValueError):
        table.update([(1, 2, 3)])
    with pytest.raises(TypeError):
        table.update([5])
    with pytest.raises(TypeError):
        U64Map(a=1)
    assert table.get(3, "d") == "d" and table.pop(3, "d") == "d"
    table[True] = "t"  # bool is an int, as in a dict
    assert table[1] == "t"


def test_a_large_table_grows_and_holds_sixteen_bytes_per_slot() -> None:
    table = U64Map()
    table.fill(range(0, 3 * 2**20, 3), 1)
    assert len(table) == 2**20 and table[3 * 1000] == 1 and 1 not in table
    assert table.__sizeof__() <= 16 * 2**21 + 64  # at most 3/4 used: 2^21 slots for 2^20 keys
    for k in range(0, 3 * 2**20, 6):
        del table[k]
    assert len(table) == 2**19 and all(table.get(k) == (1 if k % 6 else None) for k in range(0, 30000, 3))


def test_a_table_of_ints_is_left_out_of_garbage_collection() -> None:
    """A dict of ints is untracked, so a collection never walks the index; the table does the same
    until it holds a value that may be in a cycle."""
    table = U64Map()
    table.fill(list(range(1000)), 3)
    table[5] = (1, 2**70)  # a tuple of ints cannot be in a cycle either
    assert not gc.is_tracked(table) and not gc.is_tracked(table.copy())
    table[6] = [1]
    assert gc.is_tracked(table) and gc.is_tracked(table.copy())
    table[7] = (1, [2])
    assert gc.is_tracked(table)
