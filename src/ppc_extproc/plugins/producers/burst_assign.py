"""The burst producer's placement of one sealed batch (``assign``), as a pure function.

1. Group the batch's requests by their full hash list; requests without hashes are ignored. The
   replicas are the candidates of the first grouped request.
2. Units: groups of two or more; plus singletons whose first ``min_colocate_blocks`` blocks are
   shared with at least two requests of the batch (only when ``min_colocate_blocks`` > 0).
3. Order: group units, then singleton units, each stably by descending block count. Fair share
   ``ceil(total / replicas)``, total = members (balance by requests) or blocks (by tokens).
4. Place each unit: its primary replica is (``min_colocate_blocks`` > 0) the one already holding
   the longest placed prefix ≥ ``min_colocate_blocks`` below its cap and fair share, else the
   least-loaded one with cap left; runs of up to ``k − placed`` members spill to the next
   least-loaded replica. Ties: lower load, fewer running requests, lower endpoint id.

Follows ``llm-d/llm-d-router: pkg/epp/framework/plugins/requestcontrol/dataproducer/burstprefix/assign.go``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ppc_extproc.framework import Endpoint

__all__ = ["UNLIMITED", "BurstEntry", "assign"]

UNLIMITED = -1


@dataclass(eq=False, slots=True)
class BurstEntry:
    """One request of a batch."""

    #: Block hashes per prompt.
    hashes: list[list[int]]
    candidates: Sequence[Endpoint]
    assigned: Endpoint | None = None
    _flat: tuple[int, ...] = field(default=(), init=False, repr=False)

    def __post_init__(self) -> None:
        self._flat = tuple(h for prompt in self.hashes for h in prompt)

    @property
    def flat(self) -> tuple[int, ...]:
        return self._flat


class _PlacedBlocks:
    """Which replicas the batch's placed units already hold each block on."""

    def __init__(self) -> None:
        self.holders: dict[int, set[str]] = {}

    def add(self, flat: tuple[int, ...], replica: str) -> None:
        for h in flat:
            self.holders.setdefault(h, set()).add(replica)

    def longest_prefix(self, flat: tuple[int, ...]) -> dict[str, int]:
        result: dict[str, int] = {}
        for h in flat:
            holders = self.holders.get(h)
            if not holders:
                break
            for name in holders:
                result[name] = result.get(name, 0) + 1
        return result


RunningRequests = Callable[[Endpoint], int]


def assign(
    entries: Sequence[BurstEntry],
    k: int = UNLIMITED,
    min_colocate_blocks: int = 0,
    by_tokens: bool = False,
    running: RunningRequests = lambda endpoint: 0,
) -> None:
    """Set ``assigned`` on the entries placed; the others keep None."""
    groups: dict[tuple[int, ...], list[BurstEntry]] = {}
    replicas: Sequence[Endpoint] = ()
    for entry in entries:
        if not entry.flat:
            continue
        groups.setdefault(entry.flat, []).append(entry)
        if not replicas:
            replicas = entry.candidates
    if not replicas:
        return
    shared = _shared_prefix_keys(groups, min_colocate_blocks)
    group_units = [key for key, members in groups.items() if len(members) >= 2]
    single_units = [key for key, members in groups.items() if len(members) < 2 and key in shared]
    if not group_units and not single_units:
        return
    group_units.sort(key=len, reverse=True)  # stable: ties keep batch order
    single_units.sort(key=len, reverse=True)
    units = group_units + single_units
    total = sum(len(key) if by_tokens else len(groups[key]) for key in units)
    max_share = -(-total // len(replicas))
    placed = _PlacedBlocks()
    load: dict[str, int] = {}
    for key in units:
        _place(groups[key], replicas, k, min_colocate_blocks, max_share, placed, load, by_tokens, running)


def _shared_prefix_keys(groups: dict[tuple[int, ...], list[BurstEntry]], n: int) -> set[tuple[int, ...]]:
    if n <= 0:
        return set()
    count: dict[tuple[int, ...], int] = {}
    signature: dict[tuple[int, ...], tuple[int, ...]] = {}
    for key, members in groups.items():
        if len(key) < n:
            continue
        signature[key] = key[:n]
        count[key[:n]] = count.get(key[:n], 0) + len(members)
    return {key for key, sig in signature.items() if count[sig] >= 2}


def _place(
    members: list[BurstEntry],
    replicas: Sequence[Endpoint],
    k: int,
    min_colocate_blocks: int,
    max_share: int,
    placed: _PlacedBlocks,
    load: dict[str, int],
    by_tokens: bool,
    running: RunningRequests,
) -> None:
    flat = members[0].flat
    prefer_match = min_colocate_blocks > 0
    matches = placed.longest_prefix(flat) if prefer_match or by_tokens else {}
    per_replica: dict[str, int] = {}
    i = 0
    while i < len(members):
        target = _pick(replicas, per_replica, k, load, matches, min_colocate_blocks, max_share, prefer_match, running)
        name = target.id
        run = len(members) - i
        if k != UNLIMITED:
            run = min(run, max(1, k - per_replica.get(name, 0)))  # overflow guard: at least one
        for member in members[i : i + run]:
            member.assigned = target
        first_touch = per_replica.get(name, 0) == 0
        per_replica[name] = per_replica.get(name, 0) + run
        if not by_tokens:
            load[name] = load.get(name, 0) + run
        elif first_touch:
            load[name] = load.get(name, 0) + max(0, len(flat) - matches.get(name, 0))
        i += run
        prefer_match = False  # only the primary replica gets the prefix preference
    for member in members:
        if member.assigned is not None:
            placed.add(flat, member.assigned.id)


def _before(a: Endpoint, b: Endpoint | None, load: dict[str, int], running: RunningRequests) -> bool:
    if b is None:
        return True
    la, lb = load.get(a.id, 0), load.get(b.id, 0)
    if la != lb:
        return la < lb
    ra, rb = running(a), running(b)
    if ra != rb:
        return ra < rb
    return a.id < b.id


def _pick(
    replicas: Sequence[Endpoint],
    per_replica: dict[str, int],
    k: int,
    load: dict[str, int],
    matches: dict[str, int],
    min_colocate_blocks: int,
    max_share: int,
    prefer_match: bool,
    running: RunningRequests,
) -> Endpoint:
    if prefer_match:
        best: Endpoint | None = None
        best_match = 0
        for replica in replicas:
            if k != UNLIMITED and per_replica.get(replica.id, 0) >= k:
                continue
            if load.get(replica.id, 0) >= max_share:
                continue  # at fair share: co-locating here would unbalance the batch
            m = matches.get(replica.id, 0)
            if m < min_colocate_blocks:
                continue
            if best is None or m > best_match or (m == best_match and _before(replica, best, load, running)):
                best, best_match = replica, m
        if best is not None:
            return best
    chosen: Endpoint | None = None
    for replica in replicas:
        if k != UNLIMITED and per_replica.get(replica.id, 0) >= k:
            continue
        if _before(replica, chosen, load, running):
            chosen = replica
    if chosen is None:
        for replica in replicas:
            if _before(replica, chosen, load, running):
                chosen = replica
    assert chosen is not None
    return chosen
