"""``session-affinity-scorer``: prefer the endpoint the request's session was routed to before.

Type        ``session-affinity-scorer`` (scorer; also looks bindings up before scheduling and
            records them after the pick)
Formula     bound endpoint among the candidates ⇒ 1.0, every other 0.0; no session, or its
            endpoint is not a candidate ⇒ 0.0 everywhere (others decide) — with
            ``placement: fewestBindings``: ``1 − (n(ep) − min n) / (max n − min n)`` over the
            candidates' binding counts (all 1.0 when equal) for a new session; a session whose
            endpoint is gone ⇒ 1.0 on its rendezvous-hash endpoint among the candidates
Strategies  ``encoded_endpoint_header`` (default): header ``x-session-token`` = base64 of the
            endpoint's identity (its name, ``<namespace>/<pod>-rank-<i>``, else ``ip:port``);
            the response carries the serving endpoint's token.
            ``session_id``: server-side bindings of an opaque session id (see below)
Consumes    the attributes its ``sources`` name (optional: an absent one is skipped)
Parameters  ``strategy`` [encoded_endpoint_header | session_id]; ``profileName`` [""] (pin the pod
            of that profile, e.g. ``prefill``; "" ⇒ the primary profile);
            ``encodedEndpointHeaderConfig.header`` [x-session-token];
            ``sessionIdConfig``: ``sources`` [``- header: x-session-id``; each entry exactly one of
            ``header`` or ``attribute`` (+ ``producer``), first non-empty wins],
            ``evictionTtlSeconds`` [300], ``evictionSweepSeconds`` [10] — llm-d's; and
            ppc-extproc's ``maxBindings`` [65536] (LRU bound), ``placement`` [none |
            fewestBindings (and, while the bound endpoint is a candidate, its runner-up — Envoy's
            fallback when it fails — scores 0.5: the session id's rendezvous-hash endpoint among
            the others, so the sessions of a pod that dies spread evenly over the rest even when
            every replica fails them over at once)], ``sharedStore`` {``address`` redis://host:port, ``keyPrefix``
            [ppc-extproc:sessions], ``timeoutMs`` [50], ``failureThreshold`` [3] failures in a row
            before the store is skipped for ``retrySeconds`` [1],
            ``maxPendingWrites`` [10000]}: bindings shared by replicas through Valkey/Redis
            (``pip install 'ppc-extproc[shared-state]'``); the store down or slow ⇒ local bindings.
            llm-d: ``pkg/epp/framework/plugins/scheduling/scorer/sessionaffinity/``.

    plugins:
    - type: agent-identity
    - type: session-affinity-scorer
      parameters:
        strategy: session_id
        sessionIdConfig:
          sources: [{header: x-session-id}, {attribute: agent-identity}]
          evictionTtlSeconds: 300
          sharedStore: {address: "redis://valkey:6379"}
    schedulingProfiles:
    - name: default
      plugins: [{pluginRef: session-affinity-scorer, weight: 10}, {pluginRef: max-score-picker}]

With ``fewestBindings`` the bound endpoint leads its runner-up by half the weight: give the scorer
more than twice the profile's other weights together (the loader warns otherwise).
"""

from __future__ import annotations

from collections.abc import Sequence

from ppc_extproc.framework import (
    AsyncDataProducer,
    AsyncPreRequest,
    DataConsumer,
    Endpoint,
    Lifecycle,
    ResponseComplete,
    ResponseHeaderProcessor,
    SchedulingContext,
    Scorer,
    StateReporter,
    Ticker,
)
from ppc_extproc.ids import EndpointId
from ppc_extproc.plugins._session_affinity import SessionAffinityPlugin
from ppc_extproc.plugins.registry import register

__all__ = ["SessionAffinityScorer"]

TYPE_NAME = "session-affinity-scorer"
#: The bound endpoint's runner-up: above every other candidate, well below the bound one.
RUNNER_UP_SCORE = 0.5


@register(TYPE_NAME)
class SessionAffinityScorer(SessionAffinityPlugin, Scorer, AsyncDataProducer, DataConsumer, AsyncPreRequest, ResponseComplete,
                            ResponseHeaderProcessor, Lifecycle, Ticker, StateReporter):  # fmt: skip
    TYPE_NAME = TYPE_NAME

    def weight_warning(self, weight: float, other_weights: float) -> str | None:
        """Why ``weight`` is too low against the profile's ``other_weights`` together, or None:
        with ``fewestBindings`` the bound endpoint leads its runner-up by only half the weight."""
        core = self.core
        if core.bindings is None or core.config.session_id.placement != "fewestBindings":
            return None
        if weight * RUNNER_UP_SCORE > other_weights:
            return None
        return (f"{self.name} has weight {weight:g} and the other scorers {other_weights:g} in all; with placement "
                "fewestBindings a session can leave its endpoint for its runner-up whenever they agree (a weight "
                f"above {other_weights / RUNNER_UP_SCORE:g} keeps it)")

    def score(self, ctx: SchedulingContext, endpoints: Sequence[Endpoint]) -> dict[EndpointId, float]:
        target = self.core.choose(ctx, endpoints)
        if target is not None:
            scores = {e.id: 1.0 if e.id == target.id else 0.0 for e in endpoints}
            runner_up = self.core.runner_up(ctx, target, endpoints)
            if runner_up is not None:
                scores[runner_up] = RUNNER_UP_SCORE
            return scores
        moved = self.core.replacement(ctx, endpoints)
        if moved is not None:
            return {e.id: 1.0 if e.id == moved else 0.0 for e in endpoints}
        counts = self.core.placement_counts(ctx, endpoints)
        if not counts:
            return {e.id: 0.0 for e in endpoints}
        low, high = min(counts.values()), max(counts.values())
        if high == low:
            return dict.fromkeys(counts, 1.0)
        return {e: 1.0 - (n - low) / (high - low) for e, n in counts.items()}
