"""The two-generation LRU: bulk writes behave exactly like the same writes one key at a time."""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import given, settings
from hypothesis import strategies as st

from ppc_extproc import native
from ppc_extproc.index.lru import TwoGenerationLRU

keys = st.lists(st.integers(0, 120), min_size=1, max_size=70, unique=True)  # both paths: < and > 32 keys
ops = st.lists(st.tuples(st.sampled_from(["set", "or", "get"]), keys, st.integers(1, 7)), max_size=30)


def _gets_up_to_a_miss(lru: TwoGenerationLRU[int, int], keys: list[int]) -> list[int]:
    found = []
    for key in keys:
        value = lru.get(key)
        if value is None:
            break
        found.append(value)
    return found


def _or(bits: int) -> Callable[[int | None], int]:
    return lambda mask: bits if mask is None else mask | bits


def _one_by_one(lru: TwoGenerationLRU[int, int], op: str, ks: list[int], bits: int) -> None:
    for k in ks:
        if op == "set":
            lru.set(k, bits)
        elif op == "or":
            current = lru.peek(k)  # read, then one write: a single touch, like or_bits
            lru.set(k, bits if current is None else current | bits)
        else:
            lru.get(k)


def _state(lru: TwoGenerationLRU[int, int]) -> tuple[dict[int, int], dict[int, int]]:
    return dict(lru._young), dict(lru._old)


@settings(max_examples=300, deadline=None)
@given(st.integers(2, 90), ops)
def test_bulk_operations_equal_single_key_operations(capacity: int, sequence) -> None:
    bulk: TwoGenerationLRU[int, int] = TwoGenerationLRU(capacity)
    single: TwoGenerationLRU[int, int] = TwoGenerationLRU(capacity)
    for op, ks, bits in sequence:
        if op == "set":
            bulk.set_many(ks, [bits] * len(ks))
        elif op == "or":
            bulk.or_bits(ks, _or(bits))
        else:
            ks = ks[: sum(n for _, n in bulk.get_prefix_runs(ks))]  # stops at the first absent key
        _one_by_one(single, op, ks, bits)
        assert {**_state(bulk)[1], **_state(bulk)[0]} == {**_state(single)[1], **_state(single)[0]}
        assert len(bulk) <= capacity


@settings(max_examples=300, deadline=None)
@given(st.integers(2, 90), ops, st.lists(st.integers(0, 120), max_size=70), st.booleans())
def test_prefix_runs_equal_the_runs_of_single_gets(capacity: int, sequence, probe: list[int], dicts: bool) -> None:
    # get_prefix_runs reads and touches exactly what gets up to the first absent key do,
    # rotations included.
    table = dict if dicts else None
    runs: TwoGenerationLRU[int, int] = TwoGenerationLRU(capacity, table)
    values: TwoGenerationLRU[int, int] = TwoGenerationLRU(capacity, table)
    for op, ks, bits in sequence:
        for lru in (runs, values):
            if op != "get":
                lru.set_many(ks, [bits % 3] * len(ks))
        if op == "get":
            runs.get_prefix_runs(ks)
            _gets_up_to_a_miss(values, ks)
    found = _gets_up_to_a_miss(values, probe)
    assert runs.get_prefix_runs(probe) == native.py_runs(found)
    assert _state(runs) == _state(values) and runs.evicted == values.evicted


def test_a_run_that_spans_a_rotation_stays_one_run() -> None:
    for table in (None, dict):
        lru: TwoGenerationLRU[int, int] = TwoGenerationLRU(8, table)
        lru.set_many([0, 1, 2, 3], [7] * 4)  # young full: rotated to old
        lru.set_many([4, 5, 6], [7] * 3)
        # Promoting 0 fills young, which rotates before 4, 5 and 6 are walked.
        assert lru.get_prefix_runs([0, 4, 5, 6, 9]) == [(7, 4)]
        assert lru.evicted == 3  # 1, 2 and 3 went with the old generation


def test_a_key_touched_within_half_the_capacity_survives() -> None:
    lru: TwoGenerationLRU[int, str] = TwoGenerationLRU(10)
    lru.set_many(list(range(5)), ["a"] * 5)
    assert lru.get(0) == "a"
    lru.set_many(list(range(100, 105)), ["b"] * 5)
    assert 0 in lru and all(k not in lru for k in range(1, 5))
    assert lru.evicted == 4
