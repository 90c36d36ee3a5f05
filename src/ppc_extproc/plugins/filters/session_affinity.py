"""``session-affinity-filter``: keep only the endpoint the request's session was routed to before.

Type        ``session-affinity-filter`` (filter; also looks bindings up before scheduling and
            records them after the pick)
Rule        bound endpoint among the candidates ⇒ that endpoint alone; no session, an unbound
            one, or its endpoint is not a candidate ⇒ every candidate (never an empty set) —
            with ``placement: fewestBindings`` a session without a usable binding keeps the
            candidates with the fewest bindings
Parameters  as ``session-affinity-scorer`` (the same strategies, keys and defaults); the filter
            and a scorer keep separate bindings: configure one of them.
            llm-d: ``pkg/epp/framework/plugins/scheduling/filter/sessionaffinity/``.

    plugins:
    - type: session-affinity-filter
      parameters:
        strategy: session_id
        sessionIdConfig:
          sources: [{header: x-session-id}]
          placement: fewestBindings
          sharedStore: {address: "redis://valkey:6379", timeoutMs: 50}
    schedulingProfiles:
    - name: default
      plugins: [{pluginRef: session-affinity-filter}, {pluginRef: max-score-picker}]
"""

from __future__ import annotations

from collections.abc import Sequence

from ppc_extproc.framework import (
    AsyncDataProducer,
    Consumes,
    DataConsumer,
    DataKey,
    Endpoint,
    Filter,
    Lifecycle,
    PluginState,
    PreRequest,
    ResponseComplete,
    ResponseHeaderProcessor,
    ResponseInfo,
    SchedulingContext,
    SchedulingResult,
    StateReporter,
    Ticker,
)
from ppc_extproc.framework.params import Section
from ppc_extproc.ids import EndpointId
from ppc_extproc.plugins._session_affinity import SessionAffinityConfig, SessionAffinityCore, decode_config
from ppc_extproc.plugins.registry import Services, register

__all__ = ["SessionAffinityFilter"]

TYPE_NAME = "session-affinity-filter"


@register(TYPE_NAME)
class SessionAffinityFilter(Filter, AsyncDataProducer, DataConsumer, PreRequest, ResponseComplete,
                            ResponseHeaderProcessor, Lifecycle, Ticker, StateReporter):  # fmt: skip
    #: The binding lookup bounds itself (``sharedStore.timeoutMs``) and never fails.
    produce_timeout_seconds: float | None = None

    def __init__(self, name: str, config: SessionAffinityConfig | None = None, services: Services | None = None) -> None:
        self.name = name
        self.core = SessionAffinityCore(name, TYPE_NAME, config or SessionAffinityConfig(), services or Services())

    @classmethod
    def from_parameters(cls, name: str, params: Section, services: Services) -> SessionAffinityFilter:
        return cls(name, decode_config(params), services)

    def consumes(self) -> tuple[Consumes[object], ...]:
        return self.core.consumes()

    def produces(self) -> frozenset[DataKey[object]]:
        return self.core.produces()

    async def produce_async(self, ctx: SchedulingContext) -> None:
        await self.core.produce_async(ctx)

    def filter(self, ctx: SchedulingContext, endpoints: Sequence[Endpoint]) -> list[Endpoint]:
        target = self.core.choose(ctx, endpoints)
        if target is not None:
            return [target]
        counts = self.core.placement_counts(ctx, endpoints)
        if not counts:
            return list(endpoints)
        fewest = min(counts.values())
        return [e for e in endpoints if counts[e.id] == fewest]

    def pre_request(self, ctx: SchedulingContext, result: SchedulingResult) -> None:
        self.core.pre_request(ctx, result)

    def response_complete(self, ctx: SchedulingContext, info: ResponseInfo) -> None:
        self.core.response_complete(ctx, info)

    def response_headers(self, ctx: SchedulingContext, result: SchedulingResult, served: EndpointId) -> list[tuple[str, str]]:
        return self.core.response_headers(ctx, result, served)

    async def start(self) -> None:
        await self.core.start()

    async def stop(self) -> None:
        await self.core.stop()

    def tick(self, now: float) -> None:
        self.core.tick(now)

    def state(self, *, detailed: bool = False) -> PluginState:
        return self.core.state(detailed=detailed)
