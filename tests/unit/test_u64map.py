"""``native.U64Map`` (the C table of the index's generations) behaves like a dict on the subset the
LRU uses, and the LRU gives the same results on it as on dicts; values are reference-counted and
collected; keys outside [0, 2^64) are refused."""

from __future__ import annotations

import gc
import random
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



GROWTH_OPS = st.lists(
    st.tuples(st.sampled_from(["set", "fill", "del", "get", "get_many", "popitem", "copy"]), st.integers(0, 140), VALUES),
    max_size=150,
)


@settings(max_examples=200, deadline=None)
@given(st.integers(90, 100), st.randoms(use_true_random=False), GROWTH_OPS)
def test_a_table_in_the_middle_of_its_growth_behaves_like_a_dict(prefill: int, rng: Any, ops: list[tuple[str, int, int]]) -> None:
    """Around 96 keys a table of 128 slots doubles, and its entries then move a few per insertion.
    Random keys make runs of neighbours, so reads, removals and moves meet entries in both arrays
    and followers that a removal shifts back."""
    held = [rng.getrandbits(64) for _ in range(prefill)]

    def key(i: int) -> int:
        return held[i] if i < prefill else 2**40 + i

    table = U64Map()
    table.fill(held, 9)
    model = dict.fromkeys(held, 9)
    for op, i, value in ops:
        keys = [key(j) for j in range(i, i + 6)] if op in ("fill", "get_many") else [key(i)]
        if op in ("set", "fill"):
            table.fill(keys, value)
            model.update(dict.fromkeys(keys, value))
        elif op == "del":
            assert table.pop(keys[0], None) == model.pop(keys[0], None)
        elif op == "popitem" and model:
            popped, was = table.popitem()
            assert model.pop(popped) == was
        elif op == "copy":
            table = table.copy()
        else:
            assert table.get_many(keys) == [model.get(k) for k in keys]
        assert len(table) == len(model)
    assert dict(table) == model and all(table[k] == v for k, v in model.items())


def test_a_doubling_is_prepared_ahead_and_its_entries_move_a_few_per_insertion() -> None:
    """A table of 2^16 slots or more allocates its doubled array when 5/8 of the slots are used,
    doubles past 3/4, and holds both arrays until the insertions after the doubling have moved
    every entry over: eight old slots or more per insertion. Its size shows each step."""
    slots, slot = 2**16, 16
    table = U64Map()
    table.fill(range(slots * 5 // 8), 1)
    base = table.__sizeof__() - slots * slot
    table[10**9] = 2  # the doubled array, allocated ahead
    assert table.__sizeof__() == base + 3 * slots * slot
    table.fill(range(10**9 + 1, 10**9 + slots // 8), 2)  # to 3/4 of the slots
    assert len(table) == slots * 3 // 4 and table.__sizeof__() == base + 3 * slots * slot
    table[2**40] = 3  # the doubling: the same two arrays, the old one now draining
    assert table.__sizeof__() == base + 3 * slots * slot
    table.fill(range(2**41, 2**41 + 1_000), 4)  # 8 old slots per insertion, or to the end of a run
    table[1] = 5  # an update moves nothing
    assert table.__sizeof__() == base + 3 * slots * slot
    table.fill(range(2**42, 2**42 + slots // 8 - 1_000), 6)  # 2^16 old slots moved by now
    assert table.__sizeof__() == base + 2 * slots * slot
    assert len(table) == slots * 3 // 4 + slots // 8 + 1
    assert table[2**40] == 3 and table[2**41] == 4 and table[2**42] == 6
    assert all(table[k] == (5 if k == 1 else 1) for k in range(slots * 5 // 8))


def test_a_large_table_finds_every_key_while_it_gives_back_the_slots_it_moved() -> None:
    """A draining array of 2^18 slots (4 MB) gives back its emptied pages in 1 MB slices as the
    moves pass them; reads, removals, copies and listings in the middle of it stay exact."""
    rng = random.Random(7)
    held = [rng.getrandbits(64) for _ in range(2**18 * 3 // 4)]
    table = U64Map()
    table.fill(held, 1)
    model = dict.fromkeys(held, 1)
    for step in range(12):
        fresh = [rng.getrandbits(64) for _ in range(1_000)]
        table.fill(fresh, step)
        model.update(dict.fromkeys(fresh, step))
        for key in held[step * 997 : step * 997 + 300]:  # some still in the old array, some moved
            assert table.pop(key, None) == model.pop(key, None)
        assert table.get_many(held) == [model.get(k) for k in held]
        if step in (3, 8):
            assert dict(table.copy()) == model
    assert len(table) == len(model) and sorted(table.items()) == sorted(model.items())

def _key_at_home(home: int, slots: int, salt: int) -> int:
    """A key whose home slot in a table of ``slots`` slots is ``home`` (the table's Fibonacci hash,
    key * 2^64/phi, read from the top bits, inverted)."""
    shift = 64 - slots.bit_length() + 1
    return (((home << shift) + salt) * pow(0x9E3779B97F4A7C15, -1, 2**64)) % 2**64


def test_a_run_that_wraps_past_the_last_slot_moves_and_leaves_no_copy_behind() -> None:
    """Two keys homed at the last of 64 slots: the second sits in slot 0. The first move after the
    doubling takes slot 0; once that key is removed, a probe from the last slot that wraps to
    slot 0 must find nothing there."""
    last, wrapped = _key_at_home(63, 64, 1), _key_at_home(63, 64, 2)
    table = U64Map()
    table.fill([_key_at_home(8 + i, 64, 3) for i in range(46)], 0)  # 64 slots, the moves done
    table[last] = "last"
    table[wrapped] = "wrapped"  # 48 keys: 3/4 of 64 slots
    table[_key_at_home(30, 64, 4)] = 1  # the doubling to 128 slots
    table[_key_at_home(31, 64, 5)] = 2  # moves the old slots 0 to 7
    assert table.pop(wrapped) == "wrapped"
    assert wrapped not in table and table.get(wrapped) is None and table[last] == "last"
    assert len(table) == 49 and "wrapped" not in table.values()

def test_a_table_told_its_final_size_prepares_no_growth_it_will_not_make() -> None:
    slots, slot = 2**16, 16
    planned = U64Map()
    planned.plan_for(slots * 3 // 4)
    planned.fill(range(slots * 3 // 4), 1)
    told_late = U64Map()
    told_late.fill(range(slots * 5 // 8 + 1), 1)
    assert told_late.__sizeof__() - planned.__sizeof__() == 2 * slots * slot  # prepared
    told_late.plan_for(slots * 3 // 4)  # and released
    assert told_late.__sizeof__() == planned.__sizeof__() == U64Map().__sizeof__() + (slots - 8) * slot
    bigger = U64Map()
    bigger.plan_for(slots)  # past 3/4 of these slots: the growth is prepared
    bigger.fill(range(slots * 5 // 8 + 1), 1)
    assert bigger.__sizeof__() == told_late.__sizeof__() + 2 * slots * slot
    with pytest.raises(ValueError, match="plan_for"):
        planned.plan_for(-1)



def test_the_lru_plans_its_young_generations_for_their_final_size() -> None:
    """A generation of 3/4 of 2^16 keys fits its table without a growth: the LRU says so, so the
    young generation prepares no doubled array, then or after a rotation."""
    slots, slot = 2**16, 16
    lru: TwoGenerationLRU[int, int] = TwoGenerationLRU(2 * (slots * 3 // 4))
    full_table = U64Map().__sizeof__() + (slots - 8) * slot
    for generation in range(2):
        start = generation * slots
        lru.set_many(list(range(start, start + slots * 3 // 4 - 1)), [1] * (slots * 3 // 4 - 1))
        assert lru._young.__sizeof__() == full_table  # unplanned, it would hold 2^17 more slots
        lru.set(start + slots, 1)  # the generation's last key: it rotates

@pytest.mark.parametrize("past_the_doubling", [1, 2, 100, 2_000])
def test_a_table_told_its_final_size_has_moved_every_entry_when_it_gets_there(past_the_doubling: int) -> None:
    """A plan that ends just past a doubling: the moves are done by the last planned insertion,
    not left half-way (entries there would each cost two probes for as long as the table lives)."""
    slots, slot = 2**12, 16
    planned = slots * 3 // 4 + past_the_doubling
    table = U64Map()
    table.plan_for(planned)
    table.fill(range(planned), 1)
    assert table.__sizeof__() == U64Map().__sizeof__() + (2 * slots - 8) * slot
    assert len(table) == planned and table.get_many([0, planned - 1, planned]) == [1, 1, None]



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
    assert table.__sizeof__() - U64Map().__sizeof__() <= 16 * (2**21 - 8)  # at most 3/4 used: 2^21 slots for 2^20 keys
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
