"""``RecentTokenArrays.read`` gives what ``native.json_uint32_array`` gives, for bodies that share
their array's beginning with a recent one or not, valid or not."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ppc_extproc import native
from ppc_extproc.tokens.recent_arrays import RecentTokenArrays

_SEPARATORS = [b",", b", ", b" ,", b",\n  "]


def _array(values: list[int], sep: bytes = b",") -> bytes:
    return b"[" + sep.join(str(v).encode() for v in values) + b"]"


def _body(array: bytes) -> bytes:
    return b'{"model":"m","prompt":' + array + b',"max_tokens":8}'


def _read_both(recent: RecentTokenArrays, body: bytes) -> tuple[object, object]:
    pos = body.index(b"[")
    return recent.read(body, pos), native.json_uint32_array(body, pos)


@settings(max_examples=300, deadline=None)
@given(
    base=st.lists(st.integers(0, 2**32 - 1), min_size=40, max_size=120),
    cut=st.integers(0, 130),
    tail=st.lists(st.integers(0, 2**32 - 1), max_size=30),
    sep=st.sampled_from(_SEPARATORS),
    junk=st.sampled_from([b"", b",", b",]", b"x", b"-1", b"01", b"1.5", b" ", b",,", b"[", b"]"]),
)
def test_a_body_after_a_recent_one_reads_as_the_scan_does(
    base: list[int], cut: int, tail: list[int], sep: bytes, junk: bytes
) -> None:
    recent = RecentTokenArrays(min_bytes=0)
    first = _body(_array(base, sep))
    assert recent.read(first, first.index(b"[")) == native.json_uint32_array(first, first.index(b"["))
    values = base[:cut] + tail
    text = _array(values, sep)
    second = _body(text[:-1] + junk + b"]") if junk else _body(text)
    got, want = _read_both(recent, second)
    assert got == want


def test_identical_and_extended_arrays_reuse_and_agree() -> None:
    rng = random.Random(3)
    recent = RecentTokenArrays()
    values = [rng.randrange(150_000) for _ in range(20_000)]
    body = _body(_array(values))
    assert _read_both(recent, body)[0] == native.json_uint32_array(body, body.index(b"["))
    assert recent.reused == 0
    again = bytes(bytearray(body))  # equal bytes, another object
    got, want = _read_both(recent, again)
    assert got == want and recent.reused == 1
    longer = _body(_array(values + [7, 8, 9]))  # the next turn of a conversation
    got, want = _read_both(recent, longer)
    assert got == want and recent.reused == 2
    changed = values[:15_000] + [1] + values[15_001:]
    got, want = _read_both(recent, _body(_array(changed)))
    assert got == want and recent.reused == 3
    early = [5] + values[1:]  # differs in the first number: another entry, read whole
    got, want = _read_both(recent, _body(_array(early)))
    assert got == want and recent.reused == 3


@pytest.mark.parametrize("tail", [b",]", b",x]", b",01]", b", ]", b",1.0]", b",-3]"])
def test_a_broken_tail_after_a_shared_array_is_refused_as_the_scan_refuses_it(tail: bytes) -> None:
    recent = RecentTokenArrays()
    values = list(range(30_000))
    body = _body(_array(values))
    recent.read(body, body.index(b"["))
    broken = _body(_array(values)[:-1] + tail)
    got, want = _read_both(recent, broken)
    assert want is None and got is None


def test_bounded_by_count_and_bytes() -> None:
    recent = RecentTokenArrays(max_arrays=3, max_bytes=1 << 30, min_bytes=0)
    bodies = [_body(_array([i] * 50)) for i in range(10)]
    for body in bodies:
        recent.read(body, body.index(b"["))
    assert len(recent._arrays) == 3
    small = RecentTokenArrays(max_arrays=100, max_bytes=4 * len(bodies[0]), min_bytes=0)
    for body in bodies:
        small.read(body, body.index(b"["))
    assert small._held <= 4 * len(bodies[0])
    assert 1 <= len(small._arrays) < 10


def test_mutable_and_short_bodies_are_read_without_being_kept() -> None:
    recent = RecentTokenArrays()
    body = _body(_array(list(range(30_000))))
    recent.read(bytearray(body), body.index(b"["))
    short = _body(_array([1, 2, 3]))
    recent.read(short, short.index(b"["))
    assert not recent._arrays
