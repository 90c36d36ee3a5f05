"""Where a prompt goes when replicas must agree without asking the store (``coldPlacement:
rendezvous``), and the decision moved to another endpoint (an adopted claim, a rendezvous home)."""

from __future__ import annotations

from collections.abc import Sequence

from ppc_extproc.framework import DataKey, Endpoint, SchedulingContext, SchedulingResult
from ppc_extproc.ids import RequestKey
from ppc_extproc.matchinfo import PrefixCacheMatchInfo
from ppc_extproc.scheduling.rendezvous import rendezvous

__all__ = ["cold_home", "is_cold", "moved_to"]


def cold_home(ctx: SchedulingContext, result: SchedulingResult, allowed: Sequence[Endpoint], first: RequestKey,
              known: int, match_key: DataKey[PrefixCacheMatchInfo]) -> Endpoint | None:  # fmt: skip
    """The prompt's rendezvous endpoint (of its first block key over ``allowed``) when the decision
    may go there without a round trip: the pick already is it, or no allowed endpoint holds a block
    of the prompt (``known``: the pick's cached blocks) and the result is a plain pick. Else None:
    the claim decides."""
    home = rendezvous(first, [e.id for e in allowed])
    target = next(e for e in allowed if e.id == home)
    if home == result.targets[0].id:
        return target
    return target if is_cold(ctx, result, allowed, known, match_key) else None


def is_cold(ctx: SchedulingContext, result: SchedulingResult, allowed: Sequence[Endpoint], known: int,
            match_key: DataKey[PrefixCacheMatchInfo]) -> bool:  # fmt: skip
    """No allowed endpoint holds a block of the prompt (``known``: the pick's cached blocks), and
    the result is a plain pick (no data-parallel rewrite): it may go to another endpoint."""
    if known or result.destinations != [t.id for t in result.targets]:
        return False
    for endpoint in allowed:
        info = ctx.endpoint_value(endpoint.id, match_key)
        if info is not None and info.cached_block_count:
            return False
    return True


def moved_to(result: SchedulingResult, target: Endpoint) -> SchedulingResult:
    """``result`` with ``target`` first (the other targets after it, as many as before)."""
    if result.targets[0].id == target.id:
        return result
    targets = [target, *(t for t in result.targets if t.id != target.id)][: len(result.targets)]
    return SchedulingResult(
        result.primary_profile, result.profile_results, targets, [t.id for t in targets], result.headers
    )
