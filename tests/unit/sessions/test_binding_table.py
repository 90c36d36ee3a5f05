"""The local binding table: LRU bound, TTL expiry (lazy and swept), counts per endpoint."""

from __future__ import annotations

import pytest

from ppc_extproc.ids import EndpointId
from ppc_extproc.sessions import BindingTable, session_key

A, B = EndpointId("10.0.0.1:8000"), EndpointId("10.0.0.2:8000")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_bind_get_move_and_counts() -> None:
    table = BindingTable(clock=Clock())
    table.bind("s1", A)
    table.bind("s2", A)
    assert table.get("s1") == A and table.bindings_of(A) == 2
    table.bind("s1", B)  # a move keeps one binding and recounts
    assert table.get("s1") == B and len(table) == 2
    assert table.per_endpoint() == {A: 1, B: 1}
    table.unbind("s2")
    assert table.get("s2") is None and table.bindings_of(A) == 0


def test_the_least_recently_used_binding_goes_first() -> None:
    table = BindingTable(max_bindings=2, clock=Clock())
    table.bind("s1", A)
    table.bind("s2", A)
    table.get("s1")  # s2 is now the oldest
    table.bind("s3", B)
    assert table.get("s2") is None and table.get("s1") == A and table.get("s3") == B
    assert table.evicted == 1 and table.per_endpoint() == {A: 1, B: 1}


def test_a_binding_unused_for_the_ttl_expires_and_use_refreshes_it() -> None:
    clock = Clock()
    table = BindingTable(ttl_seconds=10.0, clock=clock)
    table.bind("s1", A)
    table.bind("s2", B)
    clock.now += 8
    assert table.get("s1") == A  # refreshed at 108
    clock.now += 8  # 116: s2 (100) is past its TTL, s1 (108) is not
    assert table.peek("s2") is None
    assert table.sweep() == 1
    assert table.get("s1") == A and len(table) == 1 and table.bindings_of(B) == 0
    clock.now += 11
    assert table.get("s1") is None and table.expired == 2 and len(table) == 0


def test_over_long_session_ids_are_keyed_by_digest() -> None:
    long_id = "x" * 10_000
    assert session_key("short") == "short"
    key = session_key(long_id)
    assert key.startswith("sha256:") and len(key) < 80 and key == session_key(long_id)
    table = BindingTable(clock=Clock())
    table.bind(long_id, A)
    assert table.get(long_id) == A and table.get("x" * 9_999) is None


def test_bad_bounds_are_refused() -> None:
    with pytest.raises(ValueError):
        BindingTable(max_bindings=0)
    with pytest.raises(ValueError):
        BindingTable(ttl_seconds=0)
