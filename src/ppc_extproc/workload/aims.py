"""Issue #14's aims, evaluated per scenario from each policy's whole-run numbers.

* "ours" is every policy routed by ppc-extproc; **our best** is the one with the lowest TTFT p90
  (ties: higher hit rate). The **best peer** is, per metric, the peer router doing best on it.
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
    "best_ours",
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


def best_ours(runs: Sequence[PolicyNumbers]) -> PolicyNumbers | None:
    """Our policy with the lowest TTFT p90 (ties: higher hit rate); None if none completed."""
    ours = [r for r in runs if r.kind == "ours" and _valid(r.ttft_p90_s)]
    return min(ours, key=lambda r: (r.ttft_p90_s, -r.hit_rate if _valid(r.hit_rate) else 0.0), default=None)


def _ratio(a: float, b: float) -> float:
    return a / b if _valid(a) and _valid(b) and b > 0 else math.nan


def scenario_aims(key: str, runs: Sequence[PolicyNumbers]) -> list[Aim]:
    """The aims of scenario ``key`` over its runs."""
    out: list[Aim] = []
    best = best_ours(runs)
    if best is None:
        return out
    peers = [r for r in runs if r.kind == "peer"]
    hit_peers = [r for r in peers if _valid(r.hit_rate)]
    fast_peers = [r for r in peers if _valid(r.ttft_p90_s)]
    if hit_peers:
        peer = max(hit_peers, key=lambda r: r.hit_rate)
        gap = 100 * (best.hit_rate - peer.hit_rate)
        out.append(Aim(f"hit rate {best.name} − {peer.name}", gap, -LEVEL_POINTS, unit=" points"))
    if fast_peers:
        peer = min(fast_peers, key=lambda r: r.ttft_p90_s)
        ratio = _ratio(peer.ttft_p90_s, best.ttft_p90_s)
        out.append(Aim(f"TTFT p90 {peer.name} / {best.name}", ratio, LEVEL_RATIO, unit="×"))
        if key in FAST_SCENARIOS:
            out.append(Aim(f"TTFT p90 {peer.name} / {best.name} (3× faster)", ratio, FAST_RATIO, unit="×"))
    oracle = next((r for r in runs if r.kind == "oracle"), None)
    if oracle is not None:
        share = _ratio(best.hit_rate, oracle.hit_rate)
        out.append(Aim(f"hit rate {best.name} / oracle", share, ORACLE_SHARE, unit="×"))
    return out
