"""``OwnCounts``: the writes that keep a replica's hash of in-flight requests in the store equal to
its local counts, with the claim script's own counts neither lost nor counted twice."""

from __future__ import annotations

from ppc_extproc.ids import EndpointId
from ppc_extproc.plugins.datalayer.cross_replica_counts import REWRITE_SCRIPT, OwnCounts

A, B = EndpointId("10.0.0.1:8000"), EndpointId("10.0.0.2:8000")


def store_after(commands: list[tuple[bytes, ...]], hash_: dict[str, int]) -> dict[str, int]:
    """Apply ``commands`` to a model of the store's hash (as Valkey would)."""
    for name, *args in commands:
        if name == b"EVAL":
            assert args[0] == REWRITE_SCRIPT and args[1] == b"1"
            hash_.clear()
            for i in range(3, len(args), 2):
                hash_[args[i].decode()] = int(args[i + 1])
        elif name == b"HINCRBY":
            key = args[1].decode()
            hash_[key] = hash_.get(key, 0) + int(args[2])
    return hash_


def nonzero(hash_: dict[str, int]) -> dict[str, int]:
    return {k: v for k, v in hash_.items() if v}


def test_first_write_rewrites_the_hash_then_only_deltas_follow() -> None:
    counts = OwnCounts("p:n:r1", "p:replicas", 2000)
    first = counts.commands({A: 2})
    assert [c[0] for c in first] == [b"EVAL", b"PEXPIRE", b"SADD"]
    store = store_after(first, {})
    second = counts.commands({A: 1, B: 1})
    assert sorted(c[0] for c in second) == [b"HINCRBY", b"HINCRBY", b"PEXPIRE"]
    assert nonzero(store_after(second, store)) == {A: 1, B: 1}


def test_a_decision_the_script_counted_is_not_counted_again_when_it_starts() -> None:
    counts = OwnCounts("p:n:r1", "p:replicas", 2000)
    store = store_after(counts.commands({}), {})
    counts.sent()
    store[A] = store.get(A, 0) + 1  # the script's HINCRBY
    counts.answered(A)
    assert counts.commands({A: 1}) == []  # the local start: nothing left to write
    # the script counted A but the request went to B after all
    counts.sent()
    store[A] += 1
    counts.answered(A)
    assert nonzero(store_after(counts.commands({A: 1, B: 1}), store)) == {A: 1, B: 1}


def test_an_unanswered_claim_rewrites_the_hash_once_no_claim_is_outstanding() -> None:
    counts = OwnCounts("p:n:r1", "p:replicas", 2000)
    store = store_after(counts.commands({A: 1}), {})
    counts.sent()
    counts.sent()
    store[B] = 1  # one of them ran late, after its timeout
    counts.answered(None)
    assert [c[0] for c in counts.commands({A: 1, B: 0})] == []  # one still outstanding: no rewrite
    store[A] += 1
    counts.answered(A)
    rewrite = counts.commands({A: 2})
    assert rewrite[0][0] == b"EVAL" and nonzero(store_after(rewrite, store)) == {A: 2}


def test_a_heartbeat_rewrites_and_refreshes_membership_and_lost_writes_are_rewritten() -> None:
    counts = OwnCounts("p:n:r1", "p:replicas", 2000)
    store = store_after(counts.commands({A: 1}), {})
    beat = counts.commands({A: 1}, heartbeat=True)
    assert [c[0] for c in beat] == [b"EVAL", b"PEXPIRE", b"SADD"] and beat[-1][2] == b"p:n:r1"
    assert nonzero(store_after(beat, {B: 5})) == {A: 1}  # a field this replica never knew is gone
    counts.commands({A: 2})  # never sent
    counts.lost()
    assert nonzero(store_after(counts.commands({A: 3}), store)) == {A: 3}
