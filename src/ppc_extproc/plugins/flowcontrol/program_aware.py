"""``program-aware-fairness``: least attained service per program (fairness id).

Type        ``program-aware-fairness`` (flow-control fairness;
            ``llm-d/llm-d-router: pkg/epp/framework/plugins/flowcontrol/fairness/program-aware/``)
Rule        among flows with queued requests, the highest
            ``lasWeightService × (1 − norm(service)) + lasWeightHeadWait × norm(head wait)``
            dispatches, each term range-normalised over the candidates (equal values ⇒ 0);
            service decays with half-life ``lasHalfLifeSeconds`` (0: cumulative)
Service     ``serviceUnit: tokens`` (llm-d): ``prompt + 2 × completion`` tokens, added when the
            response ends; ``serviceUnit: uncachedPromptTokens`` (ppc-extproc): the uncached prompt
            tokens the request costs on the endpoint it was routed to, added at routing — a
            tenant's burst counts before its responses end, and cache hits cost nothing
Parameters  ``strategy`` [las] (the only one), ``lasWeightService`` [0.8], ``lasWeightHeadWait``
            [0.2], ``lasHalfLifeSeconds`` [60], ``evictionTtlSeconds`` [3600] (a program idle this
            long is forgotten; 0: never), ``evictionSweepSeconds`` [300] (> 0),
            ``serviceUnit`` [tokens]; at most 100,000 programs are tracked (the least recently
            active is forgotten first)
Metrics     ``llm_d_epp_program_aware_jains_fairness_index`` (Jain's index over the programs' mean
            queue waits), ``llm_d_epp_program_aware_avg_wait_time_milliseconds{program_id}``,
            ``llm_d_epp_program_aware_attained_service_tokens{program_id}`` (decayed at scrape
            time); per-program series for the 1,000 most recently active programs

    plugins:
    - type: program-aware-fairness
      parameters: {lasWeightService: 0.8, lasWeightHeadWait: 0.2, lasHalfLifeSeconds: 60}
    flowControl:
      defaultPriorityBand: {fairnessPolicyRef: program-aware-fairness}
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from prometheus_client.core import GaugeMetricFamily, Metric

from ppc_extproc.errors import ConfigError
from ppc_extproc.flowcontrol.types import FairnessPolicy, FlowItem, FlowView, OrderingPolicy
from ppc_extproc.framework.params import Section, decode, param
from ppc_extproc.plugins.registry import Services, register

__all__ = ["ProgramAwareConfig", "ProgramAwareFairness"]

MAX_PROGRAMS = 100_000
MAX_LABELLED_PROGRAMS = 1000
WEIGHT_INPUT, WEIGHT_OUTPUT = 1, 2


@dataclass(frozen=True, slots=True)
class ProgramAwareConfig:
    strategy: str = param("strategy", "las", choices=("las",))
    weight_service: float = param("lasWeightService", 0.8, minimum=0.0)
    weight_head_wait: float = param("lasWeightHeadWait", 0.2, minimum=0.0)
    half_life_seconds: float = param("lasHalfLifeSeconds", 60.0, minimum=0.0)
    eviction_ttl_seconds: float = param("evictionTtlSeconds", 3600.0, minimum=0.0)
    eviction_sweep_seconds: float = param("evictionSweepSeconds", 300.0)
    service_unit: str = param("serviceUnit", "tokens", choices=("tokens", "uncachedPromptTokens"))


@dataclass(slots=True)
class _Program:
    service: float = 0.0
    anchor: float = 0.0
    last_active: float = 0.0
    in_flight: int = 0
    waits: int = 0
    wait_total: float = 0.0


def _normalise(value: float, low: float, high: float) -> float:
    return 0.0 if high <= low else (value - low) / (high - low)


@register("program-aware-fairness")
class ProgramAwareFairness(FairnessPolicy):
    type_name = "program-aware-fairness"

    def __init__(self, name: str, config: ProgramAwareConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self.config = config
        self.clock = clock
        self._programs: OrderedDict[str, _Program] = OrderedDict()
        self._next_sweep = clock() + config.eviction_sweep_seconds

    @classmethod
    def from_parameters(cls, name: str, params: Section, services: Services) -> ProgramAwareFairness:
        config = decode(params, ProgramAwareConfig)
        if config.eviction_sweep_seconds <= 0:
            raise ConfigError(params.child_path("evictionSweepSeconds"), "must be > 0")
        return cls(name, config, services.clock)

    def _program(self, flow_id: str, now: float) -> _Program:
        program = self._programs.get(flow_id)
        if program is None:
            program = self._programs[flow_id] = _Program(anchor=now, last_active=now)
            if len(self._programs) > MAX_PROGRAMS:
                self._programs.popitem(last=False)
        return program

    def service(self, flow_id: str, now: float | None = None) -> float:
        """The program's decayed attained service."""
        now = self.clock() if now is None else now
        program = self._programs.get(flow_id)
        if program is None:
            return 0.0
        self._decay(program, now)
        return program.service

    def _decay(self, program: _Program, now: float) -> None:
        elapsed = now - program.anchor
        if elapsed > 0 and self.config.half_life_seconds > 0:
            program.service *= math.exp2(-elapsed / self.config.half_life_seconds)
        program.anchor = max(program.anchor, now)

    def _add(self, flow_id: str, cost: float) -> None:
        now = self.clock()
        program = self._program(flow_id, now)
        self._decay(program, now)
        program.service += cost
        program.last_active = now
        self._programs.move_to_end(flow_id)

    def pick(self, band: int, flows: Sequence[FlowView], ordering: OrderingPolicy) -> FlowView:
        now = self.clock()
        self._sweep(now)
        services = [self.service(f.flow_id, now) for f in flows]
        waits = [now - f.head.enqueued for f in flows]
        low_s, high_s, low_w, high_w = min(services), max(services), min(waits), max(waits)
        c = self.config
        best, best_score = flows[0], -math.inf
        for flow, service, wait in zip(flows, services, waits, strict=True):
            score = c.weight_service * (1 - _normalise(service, low_s, high_s)) + c.weight_head_wait * _normalise(
                wait, low_w, high_w)  # fmt: skip
            if score > best_score:
                best, best_score = flow, score
        return best

    def dispatched(self, item: FlowItem) -> None:
        now = self.clock()
        program = self._program(item.flow_id, now)
        program.in_flight += 1
        program.waits += 1
        program.wait_total += max(0.0, now - item.enqueued)
        program.last_active = now
        self._programs.move_to_end(item.flow_id)

    def charged(self, flow_id: str, priority: int, uncached_tokens: int) -> None:
        if self.config.service_unit == "uncachedPromptTokens":
            self._add(flow_id, float(max(0, uncached_tokens)))

    def completed(self, flow_id: str, priority: int, prompt_tokens: int | None, output_tokens: int | None) -> None:
        program = self._programs.get(flow_id)
        if program is not None:
            program.in_flight = max(0, program.in_flight - 1)
        if self.config.service_unit == "tokens" and (prompt_tokens is not None or output_tokens is not None):
            self._add(flow_id, float(WEIGHT_INPUT * (prompt_tokens or 0) + WEIGHT_OUTPUT * (output_tokens or 0)))

    def _sweep(self, now: float) -> None:
        if now < self._next_sweep:
            return
        self._next_sweep = now + self.config.eviction_sweep_seconds
        ttl = self.config.eviction_ttl_seconds
        if ttl <= 0:
            return
        idle = [fid for fid, p in self._programs.items() if not p.in_flight and now - p.last_active > ttl]
        for fid in idle:
            del self._programs[fid]

    def __len__(self) -> int:
        return len(self._programs)

    def fairness_index(self) -> float:
        """Jain's index over the programs' mean queue waits (1.0: equal; no data: 1.0)."""
        means = [p.wait_total / p.waits for p in self._programs.values() if p.waits]
        square_sum = sum(m * m for m in means)
        return 1.0 if not means or square_sum == 0 else sum(means) ** 2 / (len(means) * square_sum)

    def families(self) -> Iterator[Metric]:
        """llm-d's program-aware families, read at scrape time."""
        now = self.clock()
        index = GaugeMetricFamily("llm_d_epp_program_aware_jains_fairness_index",
                                  "Jain's Fairness Index over the average wait time per program.")  # fmt: skip
        index.add_metric([], self.fairness_index())
        yield index
        waits = GaugeMetricFamily("llm_d_epp_program_aware_avg_wait_time_milliseconds",
                                  "Running mean of flow-control queue wait time per program.", labels=["program_id"])
        service = GaugeMetricFamily("llm_d_epp_program_aware_attained_service_tokens",
                                    "Time-decayed attained service per program, in weighted tokens.",
                                    labels=["program_id"])  # fmt: skip
        for flow_id in list(reversed(self._programs))[:MAX_LABELLED_PROGRAMS]:
            program = self._programs[flow_id]
            if program.waits:
                waits.add_metric([flow_id], program.wait_total / program.waits * 1000.0)
            service.add_metric([flow_id], self.service(flow_id, now))
        yield waits
        yield service
