"""Issue #14's aims, evaluated per scenario from each policy's whole-run numbers.

* "ours" is every policy routed by ppc-extproc, and **our best** is, per metric, the one of them
  doing best on it (highest hit rate, lowest TTFT p90); so is the **best peer** among the peer
  routers. Comparing best with best per metric keeps one noisy run from choosing for both.
* Level on hit rate: ours ≥ best peer − ``LEVEL_POINTS`` percentage points.
* Level on TTFT p90: best peer's p90 / ours ≥ ``LEVEL_RATIO`` (ours at most ~10 % slower).
* Scenarios in ``FAST_SCENARIOS``: best peer's TTFT p90 / ours ≥ ``FAST_RATIO``.
* Ours ≥ ``ORACLE_SHARE`` of the oracle's hit rate.

An aim whose policies did not run is left out; a NaN value (no completed request) is not met.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "FAST_RATIO",
    "FAST_SCENARIOS",
    "LEVEL_POINTS",
    "LEVEL_RATIO",
    "ORACLE_SHARE",
    "Aim",
    "PolicyNumbers",
    "best",
    "scenario_aims",
]

LEVEL_POINTS = 1.0
LEVEL_RATIO = 1 / 1.1
FAST_RATIO = 3.0
ORACLE_SHARE = 0.97
#: Where a router's private guess of the caches goes wrong: (b) replicas … (e) pressure.
FAST_SCENARIOS = frozenset({"replicas", "restart", "outside", "pressure"})


@dataclass(frozen=True, slots=True)
class PolicyNumbers:
    """What the aims read of one policy's run."""

    name: str
    kind: str  # "ours", "peer" or "oracle"
    hit_rate: float
    ttft_p90_s: float


@dataclass(frozen=True, slots=True)
class Aim:
    text: str
    value: float
    target: float
    #: "≥" when higher is better.
    at_least: bool = True
    unit: str = ""

    @property
    def met(self) -> bool:
        if math.isnan(self.value):
            return False
        return self.value >= self.target if self.at_least else self.value <= self.target

    def line(self) -> str:
        mark = "✓" if self.met else "✗"
        op = "≥" if self.at_least else "≤"
        return f"{mark} {self.text}: {self.value:.2f}{self.unit} (aim {op} {self.target:.2f}{self.unit})"


def _valid(x: float) -> bool:
    return not math.isnan(x)


def best(runs: Sequence[PolicyNumbers], kind: str, metric: str) -> PolicyNumbers | None:
    """The run of ``kind`` best on ``metric`` (``hit_rate``: highest, ``ttft_p90_s``: lowest);
    None if no such run has a value."""
    found = [r for r in runs if r.kind == kind and _valid(getattr(r, metric))]
    if metric == "hit_rate":
        return max(found, key=lambda r: r.hit_rate, default=None)
    return min(found, key=lambda r: r.ttft_p90_s, default=None)


def _ratio(a: float, b: float) -> float:
    return a / b if _valid(a) and _valid(b) and b > 0 else math.nan


def scenario_aims(key: str, runs: Sequence[PolicyNumbers]) -> list[Aim]:
    """The aims of scenario ``key`` over its runs."""
    out: list[Aim] = []
    ours_hit, peer_hit = best(runs, "ours", "hit_rate"), best(runs, "peer", "hit_rate")
    ours_fast, peer_fast = best(runs, "ours", "ttft_p90_s"), best(runs, "peer", "ttft_p90_s")
    if ours_hit and peer_hit:
        gap = 100 * (ours_hit.hit_rate - peer_hit.hit_rate)
        out.append(Aim(f"hit rate {ours_hit.name} − {peer_hit.name}", gap, -LEVEL_POINTS, unit=" points"))
    if ours_fast and peer_fast:
        ratio = _ratio(peer_fast.ttft_p90_s, ours_fast.ttft_p90_s)
        out.append(Aim(f"TTFT p90 {peer_fast.name} / {ours_fast.name}", ratio, LEVEL_RATIO, unit="×"))
        if key in FAST_SCENARIOS:
            out.append(Aim(f"TTFT p90 {peer_fast.name} / {ours_fast.name} (3× faster)", ratio, FAST_RATIO, unit="×"))
    oracle = next((r for r in runs if r.kind == "oracle"), None)
    if ours_hit and oracle is not None:
        share = _ratio(ours_hit.hit_rate, oracle.hit_rate)
        out.append(Aim(f"hit rate {ours_hit.name} / oracle", share, ORACLE_SHARE, unit="×"))
    return out
