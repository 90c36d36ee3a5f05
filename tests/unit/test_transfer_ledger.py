"""``TransferLedger``: P/D transfers awaiting a decode engine's KV events, expiring and bounded."""

from __future__ import annotations

from ppc_extproc.events.transfers import Transfer, TransferLedger
from ppc_extproc.ids import EndpointId, RequestKey


def transfer(i: int) -> Transfer:
    return Transfer(EndpointId("10.0.0.9:8000"), 0, [RequestKey(i)], 16, 16, b"")


def test_pending_transfers_expire_and_can_be_taken() -> None:
    now = [100.0]
    ledger = TransferLedger(ttl_seconds=10, clock=lambda: now[0])
    a, b = transfer(1), transfer(2)
    ledger.record(EndpointId("d:1"), a)
    now[0] = 105.0
    ledger.record(EndpointId("d:1"), b)
    assert ledger.pending("d:1") == [a, b]
    now[0] = 111.0
    assert ledger.pending("d:1") == [b]  # a is older than the TTL
    assert ledger.take("d:1", b) and not ledger.take("d:1", b)
    assert ledger.pending("d:1") == [] and len(ledger) == 0


def test_the_ledger_is_bounded_per_engine_and_in_engines() -> None:
    ledger = TransferLedger(max_per_endpoint=3, max_endpoints=2)
    for i in range(5):
        ledger.record(EndpointId("d:1"), transfer(i))
    assert [t.keys[0] for t in ledger.pending("d:1")] == [2, 3, 4]
    ledger.record(EndpointId("d:2"), transfer(9))
    ledger.record(EndpointId("d:3"), transfer(9))  # a third engine evicts the oldest one's list
    assert ledger.pending("d:1") == [] and len(ledger) == 2 and ledger.evicted == 5
    ledger.forget("d:2")
    ledger.expire(1e12)
    assert len(ledger) == 0


def test_the_ledger_bounds_the_request_keys_it_holds() -> None:
    ledger = TransferLedger(max_keys=10)
    big = [Transfer(EndpointId("s:1"), 0, [RequestKey(k) for k in range(4)], 64, 16, b"") for _ in range(4)]
    for i, t in enumerate(big):
        ledger.record(EndpointId(f"d:{i % 2}"), t)
    assert ledger.keys_held <= 10 and not big[0].live and big[3].live
    assert ledger.take("d:1", big[3]) and ledger.keys_held == 4  # big[2] is left
    ledger.forget("d:0")
    assert ledger.keys_held == 0 and len(ledger) == 0
