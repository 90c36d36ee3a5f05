"""``probabilistic-admitter``: sheds sheddable requests with a probability rising steeply with load.

Type        ``probabilistic-admitter`` (admission, before flow control and scheduling;
            ``llm-d/llm-d-router: pkg/epp/framework/plugins/requestcontrol/admitter/probabilisticadmitter/``)
Rule        priority ≥ 0, or no endpoints ⇒ admit; else ``saturation`` = mean over endpoints of
            ``max(waiting / queueDepthThreshold, kvUsage / kvCacheUtilThreshold)`` (an endpoint never
            scraped counts 1.0) and the request is rejected (429 ``rejected-saturated``) with
            probability ``min(saturation^power × k, 1)``: ~2.3 % at 0.15, 100 % from ``(1/k)^(1/power)`` ≈ 0.32
Parameters  ``queueDepthThreshold`` [5] (> 0), ``kvCacheUtilThreshold`` [0.8] (> 0), ``power`` [5.0]
            (> 0), ``k`` [300.0] (> 0)

    plugins:
    - type: probabilistic-admitter
      parameters: {power: 5, k: 300}
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ppc_extproc.enginemetrics.types import EngineMetricsReader
from ppc_extproc.errors import ConfigError
from ppc_extproc.flowcontrol.types import Admitter
from ppc_extproc.framework import ENGINE_METRICS, Consumes, DataConsumer
from ppc_extproc.framework.params import Section, decode, param
from ppc_extproc.ids import EndpointId
from ppc_extproc.plugins.registry import Services, register

__all__ = ["ProbabilisticAdmitter", "ProbabilisticAdmitterConfig"]


@dataclass(frozen=True, slots=True)
class ProbabilisticAdmitterConfig:
    queue_depth_threshold: int = param("queueDepthThreshold", 5)
    kv_cache_util_threshold: float = param("kvCacheUtilThreshold", 0.8)
    power: float = param("power", 5.0)
    k: float = param("k", 300.0)


@register("probabilistic-admitter")
class ProbabilisticAdmitter(Admitter, DataConsumer):
    type_name = "probabilistic-admitter"

    def __init__(self, name: str, config: ProbabilisticAdmitterConfig, metrics: EngineMetricsReader,
                 rng: Callable[[], float] = random.random) -> None:  # fmt: skip
        self.name = name
        self.config = config
        self._metrics = metrics
        self.rng = rng

    @classmethod
    def from_parameters(cls, name: str, params: Section, services: Services) -> ProbabilisticAdmitter:
        config = decode(params, ProbabilisticAdmitterConfig)
        for key, value in (("queueDepthThreshold", config.queue_depth_threshold),
                           ("kvCacheUtilThreshold", config.kv_cache_util_threshold), ("power", config.power),
                           ("k", config.k)):  # fmt: skip
            if value <= 0:
                raise ConfigError(params.child_path(key), f"must be > 0, got {value}")
        return cls(name, config, services.engine_metrics)

    def consumes(self) -> tuple[Consumes[object], ...]:
        return (Consumes(ENGINE_METRICS),)

    def saturation(self, endpoints: Sequence[EndpointId]) -> float:
        c = self.config
        total = 0.0
        for endpoint in endpoints:
            m = self._metrics.snapshot(endpoint)
            if m is None:
                total += 1.0
                continue
            total += max((m.waiting or 0) / c.queue_depth_threshold, (m.kv_usage or 0.0) / c.kv_cache_util_threshold)
        return total / len(endpoints)

    def probability(self, saturation: float) -> float:
        return min(float(saturation**self.config.power) * self.config.k, 1.0)

    def admit(self, priority: int, endpoints: Sequence[EndpointId]) -> str | None:
        if priority >= 0 or not endpoints:
            return None
        saturation = self.saturation(endpoints)
        probability = self.probability(saturation)
        if self.rng() < probability:
            return f"probabilistic-admitter: rejected, saturation={saturation:.3f} prob={probability:.2f}"
        return None
