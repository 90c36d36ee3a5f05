"""The routing benchmark's scenarios: where a router's private picture of the caches goes wrong.

======== ==== ====================================================================================
key      row  what changes from the base setup
======== ==== ====================================================================================
single   (a)  nothing: one router replica sees every request
replicas (b)  ``replicas`` router replicas behind one load balancer, each sees only its share
restart  (c)  an engine (the one holding the most tenants) restarts mid-run and loses its cache
outside  (d)  a share of the arrivals goes straight to the engines, bypassing the router
pressure (e)  engines get ``1 / pressure`` of the working set as cache (1.5: the working set is
              1.5× the cluster's cache), so engines evict on their own schedule
long     (f)  a length mix: the last ``long_tenants`` tenants have a ``long_context_tokens``
              context (agentic sessions); engines get room for it and a faster prefill lane
======== ==== ====================================================================================

Every scenario is a pure function of the :class:`BaseSetup` (no processes), so the schedule of
each can be checked, and its duration estimated, before anything starts.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from ppc_extproc_lab.workload.disturbance import EngineRestart, OutsideTraffic
from ppc_extproc_lab.workload.spec import EngineProfile, Stage, WorkloadSpec

__all__ = ["SCENARIOS", "BaseSetup", "Scenario", "build_scenario", "expected_seconds"]

#: Scenario key → row letter, in report order.
SCENARIOS: dict[str, str] = {
    "single": "a", "replicas": "b", "restart": "c", "outside": "d", "pressure": "e", "long": "f",
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class BaseSetup:
    """What every scenario starts from, and each scenario's knob."""

    engines: int = 4
    spec: WorkloadSpec = field(default_factory=WorkloadSpec)
    profile: EngineProfile = field(default_factory=EngineProfile)
    stages: tuple[Stage, ...] = (Stage(10.0, 13.0),)
    #: Seconds at the start whose arrivals are sent but not counted (the cold start).
    warmup_s: float = 4.0
    replicas: int = 3
    restart: EngineRestart = field(default_factory=lambda: EngineRestart(7.0))
    outside_share: float = 0.3
    #: Working set / cluster cache in (e).
    pressure: float = 1.5
    long_tenants: int = 2
    long_context_tokens: int = 32_768
    #: (f)'s prefill lane (a cold 32K context then costs ~2 s instead of ~11 s at 3,000 tok/s).
    long_prefill_tokens_per_s: float = 16_000.0
    #: (f)'s offered rate relative to the base stages'.
    long_rate_factor: float = 0.6


@dataclass(frozen=True, slots=True)
class Scenario:
    """One row group: a cluster shape, a workload, a schedule and a disturbance."""

    key: str
    letter: str
    title: str
    engines: int
    spec: WorkloadSpec
    profile: EngineProfile
    stages: tuple[Stage, ...]
    warmup_s: float = 0.0
    replicas: int = 1
    restart: EngineRestart | None = None
    outside: OutsideTraffic | None = None

    @property
    def schedule_s(self) -> float:
        return sum(s.duration_s for s in self.stages)

    @property
    def cache_ratio(self) -> float:
        """Working set / the cluster's cache."""
        return self.spec.working_set_tokens / (self.engines * self.profile.capacity_tokens)


def _blocks_for(tokens: float, block_size: int) -> int:
    return max(1, math.ceil(tokens / block_size))


def build_scenario(key: str, base: BaseSetup) -> Scenario:
    """The scenario ``key`` (of :data:`SCENARIOS`) derived from ``base``; ``ValueError`` if
    unknown or if its longest request cannot fit one engine."""
    if key not in SCENARIOS:
        raise ValueError(f"unknown scenario {key!r}; choose from {', '.join(SCENARIOS)}")
    letter = SCENARIOS[key]
    spec, profile, stages = base.spec, base.profile, base.stages
    replicas, restart, outside = 1, None, None
    if key == "single":
        title = "one router replica"
    elif key == "replicas":
        replicas = base.replicas
        title = f"{replicas} router replicas behind one load balancer"
    elif key == "restart":
        restart = base.restart
        title = f"engine holding the most tenants restarted at {restart.at_s:g} s ({restart.mode})"
    elif key == "outside":
        outside = OutsideTraffic(base.outside_share)
        title = f"{100 * base.outside_share:.0f}% of requests sent straight to engines (outside traffic)"
    elif key == "pressure":
        capacity = spec.working_set_tokens / base.pressure
        profile = dataclasses.replace(profile, num_blocks=_blocks_for(capacity / base.engines, profile.block_size))
        title = f"cache pressure: working set {base.pressure:g}× the cluster's cache"
    else:  # long
        spec = dataclasses.replace(spec, long_tenants=base.long_tenants, long_context_tokens=base.long_context_tokens)
        ratio = base.spec.working_set_tokens / (base.engines * base.profile.capacity_tokens)
        per_engine = spec.working_set_tokens / ratio / base.engines
        longest = spec.max_prompt_tokens + spec.output_tokens
        blocks = _blocks_for(max(per_engine, 2 * longest), profile.block_size)  # two long sequences at once
        profile = dataclasses.replace(profile, num_blocks=blocks, prefill_tokens_per_s=base.long_prefill_tokens_per_s)
        stages = tuple(Stage(s.rate_per_s * base.long_rate_factor, s.duration_s) for s in stages)
        title = (
            f"length mix: {base.long_tenants} of {spec.tenants} tenants with "
            f"{base.long_context_tokens // 1024}K-token agentic contexts"
        )
    profile.check_fits(spec)
    if not 0 <= base.warmup_s < sum(s.duration_s for s in stages):
        raise ValueError("the warm-up must end before the schedule does")
    return Scenario(
        key, letter, f"({letter}) {title}", base.engines, spec, profile, stages, base.warmup_s, replicas, restart, outside
    )


def expected_seconds(scenarios: Sequence[Scenario], policies: int, *, startup_s: float = 2.5, drain_s: float = 1.5) -> float:
    """Rough wall time of running ``policies`` policies in each scenario (fresh cluster each)."""
    return sum(policies * (sc.schedule_s + startup_s + drain_s) for sc in scenarios)

