"""``burst_assign.assign``: placement of one sealed batch of the burst producer.

Ports every ``TestAssign_*`` of ``llm-d/llm-d-router:
pkg/epp/framework/plugins/requestcontrol/dataproducer/burstprefix/assign_test.go``. Pods are
``10.0.0.<n>:8000`` so that, as llm-d's ``pod<n>`` names, their ids sort in pod order (the last
tie-break).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from ppc_extproc.framework import Endpoint
from ppc_extproc.plugins.producers.burst_assign import UNLIMITED, BurstEntry, assign


def pods(n: int) -> list[Endpoint]:
    return [Endpoint(f"10.0.0.{i}", 8000, name=f"pod{i}") for i in range(1, n + 1)]


def group(n: int, prefix: Sequence[int], replicas: Sequence[Endpoint]) -> list[BurstEntry]:
    """``n`` requests of one prompt (one hash list)."""
    return [BurstEntry([list(prefix)], replicas) for _ in range(n)]


def families(replicas: Sequence[Endpoint]) -> list[list[BurstEntry]]:
    """Two prefix families of two groups of two: x* lead with blocks {1, 2}, y* with {7, 8}."""
    return [group(2, prefix, replicas) for prefix in ([1, 2, 3], [1, 2, 4], [7, 8, 5], [7, 8, 6])]


def name(entry: BurstEntry) -> str:
    return entry.assigned.name if entry.assigned is not None else ""


def counts(entries: Sequence[BurstEntry]) -> dict[str, int]:
    return dict(Counter(name(e) for e in entries))


def test_unlimited_colocates_whole_group() -> None:
    entries = group(8, [1, 2, 3], pods(4))
    assign(entries, UNLIMITED, 0, False)
    assert {name(e) for e in entries} == {"pod1"}


def test_cap_spreads_evenly() -> None:
    entries = group(8, [1, 2, 3], pods(4))
    assign(entries, 2, 0, False)
    assert counts(entries) == {"pod1": 2, "pod2": 2, "pod3": 2, "pod4": 2}


def test_cap_fills_before_spilling() -> None:
    entries = group(8, [1, 2, 3], pods(4))
    assign(entries, 4, 0, False)
    assert counts(entries) == {"pod1": 4, "pod2": 4}


def test_singleton_gets_no_affinity() -> None:
    entries = group(1, [1, 2, 3], pods(2))
    assign(entries, UNLIMITED, 0, False)
    assert entries[0].assigned is None


def test_empty_prefix_gets_no_affinity() -> None:
    replicas = pods(2)
    entries = [BurstEntry([], replicas), BurstEntry([], replicas), BurstEntry([[]], replicas)]
    assign(entries, UNLIMITED, 0, False)
    assert all(e.assigned is None for e in entries)


def test_distinct_groups_spread_across_replicas() -> None:
    replicas = pods(4)
    group_a, group_b = group(8, [1, 2, 3], replicas), group(8, [9, 9, 9], replicas)
    assign(group_a + group_b, UNLIMITED, 0, False)
    assert {name(e) for e in group_a} == {"pod1"}
    assert {name(e) for e in group_b} == {"pod2"}


def test_shared_prefix_families_colocate_within_fair_share() -> None:
    x1, x2, y1, y2 = families(pods(2))
    entries = x1 + x2 + y1 + y2
    assign(entries, UNLIMITED, 2, False)
    assert name(x1[0]) == name(x2[0])
    assert name(y1[0]) == name(y2[0])
    assert name(x1[0]) != name(y1[0])
    assert counts(entries) == {"pod1": 4, "pod2": 4}


def test_fair_share_spreads_prefix_sharing_groups() -> None:
    replicas = pods(4)
    entries = [e for last in (3, 4, 5, 6) for e in group(2, [1, 2, last], replicas)]
    assign(entries, UNLIMITED, 2, False)
    assert counts(entries) == {"pod1": 2, "pod2": 2, "pod3": 2, "pod4": 2}


def test_singleton_attaches_to_overlapping_group() -> None:
    replicas = pods(2)
    gx, sx = group(2, [1, 2, 3], replicas), group(1, [1, 2, 8], replicas)
    gy, sy = group(2, [7, 8, 5], replicas), group(1, [7, 8, 9], replicas)
    entries = gx + sx + gy + sy
    assign(entries, UNLIMITED, 2, False)
    assert name(gx[0]) == name(gx[1]) == name(sx[0])
    assert name(gy[0]) == name(gy[1]) == name(sy[0])
    assert counts(entries) == {"pod1": 3, "pod2": 3}


def test_lone_singleton_gets_no_affinity() -> None:
    replicas = pods(2)
    g, lone = group(2, [1, 2, 3], replicas), group(1, [5, 5, 5], replicas)
    assign(g + lone, UNLIMITED, 2, False)
    assert lone[0].assigned is None
    assert name(g[0]) == name(g[1]) != ""


def test_overlapping_singletons_colocate_without_groups() -> None:
    replicas = pods(2)
    entries = [e for last in (3, 4, 5, 6) for e in group(1, [1, 2, last], replicas)]
    assign(entries, UNLIMITED, 2, False)
    assert all(e.assigned is not None for e in entries)
    assert counts(entries) == {"pod1": 2, "pod2": 2}


def test_shared_prefix_below_threshold_does_not_colocate() -> None:
    x1, x2, y1, y2 = families(pods(2))
    entries = x1 + x2 + y1 + y2
    assign(entries, UNLIMITED, 3, False)
    assert name(x1[0]) != name(x2[0])
    assert counts(entries) == {"pod1": 4, "pod2": 4}


def test_single_replica_places_everything() -> None:
    replicas = pods(1)
    entries = group(4, [1, 2, 3], replicas) + group(4, [9, 9, 9], replicas)
    assign(entries, UNLIMITED, 2, False)
    assert {name(e) for e in entries} == {"pod1"}


def test_balance_by_tokens_spreads_large_prefix() -> None:
    replicas = pods(2)
    long, short1, short2 = group(2, [1, 2, 3, 4], replicas), group(2, [5], replicas), group(2, [6], replicas)
    assign(long + short1 + short2, UNLIMITED, 0, False)
    assert name(long[0]) == name(short2[0])  # by requests: a short unit joins the long one

    long, short1, short2 = group(2, [1, 2, 3, 4], replicas), group(2, [5], replicas), group(2, [6], replicas)
    assign(long + short1 + short2, UNLIMITED, 0, True)
    assert name(long[0]) != name(short1[0])  # by tokens: the long unit stays alone
    assert name(short1[0]) == name(short2[0])


def test_balance_by_tokens_discounts_shared_prefix() -> None:
    replicas = pods(2)
    head = list(range(1, 10))
    a1, a2, a3 = (group(2, [*head, last], replicas) for last in (10, 11, 12))
    assign(a1 + a2 + a3, UNLIMITED, 9, True)
    assert name(a1[0]) == name(a2[0]) == name(a3[0])


def test_overflow_guard_balances_beyond_cap() -> None:
    entries = group(8, [1, 2, 3], pods(2))
    assign(entries, 2, 0, False)
    assert all(e.assigned is not None for e in entries)
    assert counts(entries) == {"pod1": 4, "pod2": 4}


# --- ppc-extproc's tie-break on running requests (llm-d's RunningRequestsSize) ------------------------


def test_ties_go_to_the_replica_with_fewer_running_requests() -> None:
    replicas = pods(3)
    running = {"pod1": 5, "pod2": 0, "pod3": 2}
    entries = group(3, [1, 2], replicas)
    assign(entries, UNLIMITED, 0, False, running=lambda e: running[e.name])
    assert {name(e) for e in entries} == {"pod2"}


def test_the_replicas_are_the_first_grouped_requests_candidates() -> None:
    first, later = pods(2), pods(3)[1:]
    entries = [BurstEntry([], pods(3))] + group(1, [1], first) + group(1, [1], later)
    assign(entries, UNLIMITED, 0, False)
    assert {name(e) for e in entries[1:]} == {"pod1"}  # hash-less entries do not decide the replicas
