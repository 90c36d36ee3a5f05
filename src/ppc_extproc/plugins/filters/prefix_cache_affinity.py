"""``prefix-cache-affinity-filter``: keep only the endpoints that already cache the prompt, unless
that costs too much time to first token.

Type        ``prefix-cache-affinity-filter`` (filter)
Rule        ≤ 1 candidate or ``affinityThreshold`` ≤ 0 ⇒ keep all.
            With probability ``explorationProbability`` ⇒ keep all (exploration).
            sticky = candidates with ``matchBlocks / totalBlocks ≥ affinityThreshold``; none ⇒ keep all.
            TTFT gate (``maxTTFTPenaltyMs`` > 0 and some candidate is not sticky):
            ``ttft(ep) = inflight_tokens(ep) / peakPrefillThroughput × 1000`` ms;
            ``min ttft(sticky) − min ttft(non-sticky) > maxTTFTPenaltyMs`` ⇒ keep all.
            Otherwise ⇒ the sticky endpoints, in candidate order.
Consumes    ``PrefixCacheMatchInfoDataKey/<producer>``; ``InFlightLoadDataKey/<inFlightLoadProducerName>``
            (uncached prompt tokens this replica has in flight per endpoint — always known, so the
            gate always runs; the loader adds an ``inflight-load-producer`` when none is configured)
Parameters  ``affinityThreshold`` 0.80 ([0, 1]); ``explorationProbability`` 0 ([0, 1]);
            ``maxTTFTPenaltyMs`` 18000 (≥ 0; 0 = always stick); ``peakPrefillThroughput`` 15928
            tokens/s (> 0 when the gate is on; Qwen3-32B on 2×H100 TP2 — calibrate for yours);
            ``ttftSource`` ``prefillThroughput`` (``latencyPredictor`` is not supported);
            ``prefixMatchInfoProducerName`` ("" ⇒ the approximate producer);
            ``inFlightLoadProducerName`` [inflight-load-producer];
            ``latencyPredictionInfoProducerName``: accepted, unused.
            Calibration files (``prefillCalibrationFile`` …) are not supported: set the throughput.

    plugins:
    - type: precise-prefix-cache-producer
    - type: prefix-cache-affinity-filter
      parameters:
        affinityThreshold: 0.80
        maxTTFTPenaltyMs: 18000
        peakPrefillThroughput: 15928
        prefixMatchInfoProducerName: precise-prefix-cache-producer
    - type: token-load-scorer
    schedulingProfiles:
    - name: default
      plugins: [{pluginRef: prefix-cache-affinity-filter}, {pluginRef: token-load-scorer}]
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from ppc_extproc.errors import ConfigError
from ppc_extproc.framework import (
    IN_FLIGHT_LOAD,
    PREFIX_CACHE_MATCH_INFO,
    Consumes,
    DataConsumer,
    DataType,
    Endpoint,
    Filter,
    SchedulingContext,
)
from ppc_extproc.framework.params import Section, decode, param
from ppc_extproc.plugins.producers.inflight_load import INFLIGHT_LOAD_PRODUCER
from ppc_extproc.plugins.registry import Services, register
from ppc_extproc.plugins.scorers.prefix_cache import APPROXIMATE_PRODUCER

__all__ = ["AFFINITY_DECISION", "PrefixCacheAffinityConfig", "PrefixCacheAffinityFilter"]

#: Per request, under the filter's name: why it kept what it kept (not_applicable, exploration,
#: no_match, load_override or sticky).
AFFINITY_DECISION: DataType[str] = DataType("PrefixCacheAffinityDecision")

_CALIBRATION_KEYS = ("prefillCalibrationFile", "prefillCalibrationFingerprint", "prefillCalibrationRequired")


@dataclass(frozen=True, slots=True)
class PrefixCacheAffinityConfig:
    """The filter's parameters (``ttftSource`` has one value; the latency-prediction producer is
    accepted, unused)."""

    affinity_threshold: float = param("affinityThreshold", 0.80, minimum=0.0, maximum=1.0)
    exploration_probability: float = param("explorationProbability", 0.0, minimum=0.0, maximum=1.0)
    max_ttft_penalty_ms: float = param("maxTTFTPenaltyMs", 18000.0, minimum=0.0)
    peak_prefill_throughput: float = param("peakPrefillThroughput", 15928.0, minimum=0.0)
    ttft_source: str = param("ttftSource", "prefillThroughput", choices=("prefillThroughput",))
    inflight_producer: str = param("inFlightLoadProducerName", "")
    latency_producer: str = param("latencyPredictionInfoProducerName", "")
    producer_name: str = param("prefixMatchInfoProducerName", "")


@register("prefix-cache-affinity-filter")
class PrefixCacheAffinityFilter(Filter, DataConsumer):
    def __init__(
        self,
        name: str,
        *,
        affinity_threshold: float = 0.80,
        exploration_probability: float = 0.0,
        max_ttft_penalty_ms: float = 18000.0,
        peak_prefill_throughput: float = 15928.0,
        producer_name: str = "",
        inflight_producer: str = "",
        rng: random.Random | None = None,
    ) -> None:
        self.name = name
        self.load_key = IN_FLIGHT_LOAD.of(inflight_producer or INFLIGHT_LOAD_PRODUCER)
        self.decision_key = AFFINITY_DECISION.of(name)
        self.affinity_threshold = affinity_threshold
        self.exploration_probability = exploration_probability
        self.max_ttft_penalty_ms = max_ttft_penalty_ms
        self.peak_prefill_throughput = peak_prefill_throughput
        self.producer_name = producer_name
        self.match_key = PREFIX_CACHE_MATCH_INFO.of(self.reads)
        self.rng = rng or random.Random()

    @property
    def reads(self) -> str:
        """The producer whose match info this filter reads."""
        return self.producer_name or APPROXIMATE_PRODUCER

    def consumes(self) -> tuple[Consumes[object], ...]:
        return (Consumes(PREFIX_CACHE_MATCH_INFO, self.reads), Consumes(IN_FLIGHT_LOAD, self.load_key.producer))

    @classmethod
    def from_parameters(cls, name: str, params: Section, services: Services) -> PrefixCacheAffinityFilter:
        config = decode(params, PrefixCacheAffinityConfig)
        if config.max_ttft_penalty_ms > 0 and config.peak_prefill_throughput <= 0:
            raise ConfigError(
                params.child_path("peakPrefillThroughput"), "must be > 0 when maxTTFTPenaltyMs > 0"
            )
        for key in _CALIBRATION_KEYS:
            params.reject(key, "prefill calibration files are not supported; set peakPrefillThroughput")
        return cls(
            name,
            inflight_producer=config.inflight_producer,
            affinity_threshold=config.affinity_threshold,
            exploration_probability=config.exploration_probability,
            max_ttft_penalty_ms=config.max_ttft_penalty_ms,
            peak_prefill_throughput=config.peak_prefill_throughput,
            producer_name=config.producer_name,
        )

    def prefix_ratio(self, ctx: SchedulingContext, endpoint: Endpoint) -> float:
        info = ctx.endpoint_value(endpoint.id, self.match_key)
        if info is None or info.total_blocks <= 0:
            return 0.0
        return float(info.match_blocks / info.total_blocks)

    def ttft_ms(self, ctx: SchedulingContext, endpoint: Endpoint) -> float:
        load = ctx.get(self.load_key)
        return (load.tokens(endpoint.id) if load is not None else 0) / self.peak_prefill_throughput * 1000.0

    def filter(self, ctx: SchedulingContext, endpoints: Sequence[Endpoint]) -> list[Endpoint]:
        """The kept endpoints; ``ctx.get(decision_key)`` says why."""
        kept, decision = self._decide(ctx, endpoints)
        ctx.put(self.decision_key, decision)
        return kept

    def _decide(self, ctx: SchedulingContext, endpoints: Sequence[Endpoint]) -> tuple[list[Endpoint], str]:
        everyone = list(endpoints)
        if len(everyone) <= 1 or self.affinity_threshold <= 0:
            return everyone, "not_applicable"
        if self.exploration_probability > 0 and self.rng.random() < self.exploration_probability:
            return everyone, "exploration"
        sticky = [e for e in everyone if self.prefix_ratio(ctx, e) >= self.affinity_threshold]
        if not sticky:
            return everyone, "no_match"
        if self.max_ttft_penalty_ms > 0 and len(sticky) < len(everyone):
            sticky_ids = {e.id for e in sticky}
            best_sticky = min(self.ttft_ms(ctx, e) for e in sticky)
            best_other = min(self.ttft_ms(ctx, e) for e in everyone if e.id not in sticky_ids)
            if best_sticky - best_other > self.max_ttft_penalty_ms:
                return everyone, "load_override"
        return sticky, "sticky"
