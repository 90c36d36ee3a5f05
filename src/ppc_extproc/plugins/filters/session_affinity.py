"""``session-affinity-filter``: keep only the endpoint the request's session was routed to before.

Type        ``session-affinity-filter`` (filter; also looks bindings up before scheduling and
            records them after the pick)
Rule        bound endpoint among the candidates ⇒ that endpoint alone; no session, an unbound
            one, or its endpoint is not a candidate ⇒ every candidate (never an empty set) —
            with ``placement: fewestBindings`` a new session keeps the candidates with the
            fewest bindings, and one whose endpoint is gone its rendezvous-hash endpoint
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
    AsyncPreRequest,
    DataConsumer,
    Endpoint,
    Filter,
    Lifecycle,
    ResponseComplete,
    ResponseHeaderProcessor,
    SchedulingContext,
    StateReporter,
    Ticker,
)
from ppc_extproc.plugins._session_affinity import SessionAffinityPlugin
from ppc_extproc.plugins.registry import register

__all__ = ["SessionAffinityFilter"]

TYPE_NAME = "session-affinity-filter"


@register(TYPE_NAME)
class SessionAffinityFilter(SessionAffinityPlugin, Filter, AsyncDataProducer, DataConsumer, AsyncPreRequest, ResponseComplete,
                            ResponseHeaderProcessor, Lifecycle, Ticker, StateReporter):  # fmt: skip
    TYPE_NAME = TYPE_NAME

    def filter(self, ctx: SchedulingContext, endpoints: Sequence[Endpoint]) -> list[Endpoint]:
        target = self.core.choose(ctx, endpoints)
        if target is not None:
            return [target]
        moved = self.core.replacement(ctx, endpoints)
        if moved is not None:
            return [e for e in endpoints if e.id == moved]
        counts = self.core.placement_counts(ctx, endpoints)
        if not counts:
            return list(endpoints)
        fewest = min(counts.values())
        return [e for e in endpoints if counts[e.id] == fewest]
