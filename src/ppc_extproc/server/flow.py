"""Build a service's admission path from its loaded configuration: admitters, flow control
(``featureGates: [flowControl]``) with its metric families, or the legacy saturation rule with
a configured detector."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from ppc_extproc.config.epp import LoadedConfig
from ppc_extproc.flowcontrol.admission import Admission
from ppc_extproc.flowcontrol.controller import FlowController
from ppc_extproc.flowcontrol.stats import FlowStats, FlowStatsCollector
from ppc_extproc.ids import EndpointId
from ppc_extproc.plugins.flowcontrol.program_aware import ProgramAwareFairness
from ppc_extproc.scheduling.pool import EndpointPool

__all__ = ["build_admission"]


class _ProgramCollector(Collector):
    """``program-aware-fairness``'s families (the first instance's, as llm-d shares one set)."""

    def __init__(self, policies: list[ProgramAwareFairness]) -> None:
        self.policies = policies

    def collect(self) -> Iterator[Metric]:
        yield from self.policies[0].families()


def build_admission(loaded: LoadedConfig, pool: EndpointPool, registry: CollectorRegistry,
                    pool_name: str) -> tuple[Admission | None, FlowController | None]:  # fmt: skip
    """(admission, its flow controller); (None, None) when the configuration names no admitter,
    no saturation detector and leaves the gate off (the built-in legacy rule applies)."""
    plan = loaded.flow_control
    if plan is None or not (plan.enabled or plan.admitters or plan.detector is not None):
        return None, None

    def endpoints() -> list[EndpointId]:
        return [e.id for e in pool.endpoints()]

    clock = loaded.services.clock
    controller = None
    if plan.enabled and plan.policies is not None:
        stats = FlowStats()
        controller = FlowController(plan.spec, plan.policies, endpoints, stats=stats, clock=clock)

        def usage() -> tuple[dict[int, tuple[int, int, int, int]], tuple[int, int]]:
            return controller.band_usage(), (controller.queued, controller.queued_bytes)

        registry.register(FlowStatsCollector(stats, pool_name, plan.policies.detector.type_name, usage,
                                             (plan.spec.max_requests, plan.spec.max_bytes)))  # fmt: skip
        programs = [f for f in plan.policies.fairness.values() if isinstance(f, ProgramAwareFairness)]
        if programs:
            registry.register(_ProgramCollector(programs))
    admission = Admission(endpoints, admitters=plan.admitters, controller=controller, detector=plan.detector,
                          clock=clock)  # fmt: skip
    return admission, controller
