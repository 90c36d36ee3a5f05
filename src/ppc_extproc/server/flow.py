"""A service's admission path: built from its loaded configuration (admitters, flow control with
its metric families, or the legacy saturation rule with a configured detector), and run for each
request before it is routed."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from ppc_extproc.config.epp import LoadedConfig
from ppc_extproc.errors import SaturatedError
from ppc_extproc.flowcontrol.admission import Admission
from ppc_extproc.flowcontrol.controller import FlowController, Ticket
from ppc_extproc.flowcontrol.stats import FlowStats, FlowStatsCollector
from ppc_extproc.framework import LLMRequest
from ppc_extproc.ids import EndpointId
from ppc_extproc.plugins.flowcontrol.program_aware import ProgramAwareFairness
from ppc_extproc.scheduling.pool import EndpointPool
from ppc_extproc.scheduling.router import Decision, Router
from ppc_extproc.server.stream_protocol import StreamOptions

__all__ = ["admit_and_route", "build_admission"]


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


async def admit_and_route(router: Router, options: StreamOptions, request: LLMRequest, subset: list[str] | None,
                          headers: Mapping[str, str], priority: int, size: int, model: str,
                          waited: float) -> tuple[Decision, Ticket | None]:  # fmt: skip
    """Admit the request (it may wait in flow control, or be dropped with a ``RequestError``),
    then route it; flow control learns where it went, or that it never got there."""
    ticket = None
    if options.admission is not None:
        ticket = await options.admission.admit(request.request_id, headers, priority, size, model, request.model,
                                               waited=waited)  # fmt: skip
    elif priority < 0 and options.saturation is not None and options.saturation.saturated():
        raise SaturatedError("system saturated, sheddable request dropped")
    try:
        decision = await router.route(request, subset)
    except BaseException:
        if ticket is not None:
            ticket.abandon()
        raise
    if ticket is not None:
        primary = decision.primary.id
        ticket.routed(primary, decision.ctx.uncached_tokens(primary))
    return decision, ticket
