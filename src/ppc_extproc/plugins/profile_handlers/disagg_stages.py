"""What every P/D handler shares: the prefill pick's health check, the data-plane headers, the
evidence a failed prefill leg leaves, and the decision counters llm-d exports.

The prefill stage has a cheap fallback — the decode engine prefills the prompt itself — so it
takes no risk: a prefill pick that endpoint health holds down or whose KV-event subscriber lost
its engine (``EndpointHealth.suspect``) is replaced by the best-scored healthy prefill candidate
of the same profile; with none left the request is routed without ``x-prefiller-host-port``
(counted under ``ppc_extproc_pd_prefill_fallback_total``) and never fails for it. llm-d removed
that fallback (llm-d/llm-d-router PR #1206). The routing sidecar answers a failed prefill leg with
the prefill endpoint's own status (502 when it cannot connect, after ``--prefill-max-retries``
[0] retries on 502/503/504); such a response to a disaggregated request holds the prefill
endpoint down like a connection failure Envoy reports, so the next requests go elsewhere. So does
a successful response carrying ``x-prefill-fallback`` (a sidecar that prefilled locally because
the prefill leg failed: the lab's ``--prefill-fallback local``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ppc_extproc.framework import (
    DataType,
    Endpoint,
    ProfileResult,
    ResponseInfo,
    SchedulingContext,
    SchedulingResult,
)
from ppc_extproc.ids import EndpointId, destination_host_port
from ppc_extproc.scheduling.health import EndpointHealth

__all__ = [
    "ENCODER_HEADER",
    "KV_CACHE_SOURCE_HEADER",
    "PREFILL_HEADER",
    "DecisionCounters",
    "StageState",
    "decision_type",
    "prefill_failed",
    "set_disagg_headers",
    "settle_prefill",
]

#: ``llm-d/llm-d-router: pkg/common/routing/common.go``.
PREFILL_HEADER = "x-prefiller-host-port"
ENCODER_HEADER = "x-encoder-hosts-ports"
KV_CACHE_SOURCE_HEADER = "x-kv-cache-source-host-port"

#: Statuses the sidecar relays from a prefill leg it could not complete (its retryable set).
_PREFILL_LEG_FAILURES = frozenset({502, 503, 504})
#: Distinct (family, model, decision) series kept; further models count as ``other``.
_MAX_SERIES = 4096


@dataclass(slots=True)
class StageState:
    """Per request: stages a decider turned down, and the prefill pick once checked."""

    skipped: set[str] = field(default_factory=set)
    checked: bool = False
    prefill: Endpoint | None = None
    #: Why the request prefills locally although its decider said yes.
    fallback: str | None = None
    repicked: bool = False


_STATE: DataType[StageState] = DataType("DisaggStageState")
#: The prefill endpoint a request's header named (for the response's evidence).
_PREFILLER: DataType[EndpointId] = DataType("DisaggPrefiller")


def stage_state(ctx: SchedulingContext, owner: str) -> StageState:
    key = _STATE.of(owner)
    state = ctx.get(key)
    if state is None:
        state = StageState()
        ctx.put(key, state)
    return state


def settle_prefill(
    ctx: SchedulingContext, results: Mapping[str, ProfileResult], profile: str, state: StageState,
    health: EndpointHealth,
) -> Endpoint | None:
    """The prefill pick after the health check (once per request): the profile's first target,
    or its best-scored healthy candidate, or None (no prefill stage, or local prefill)."""
    result = results.get(profile)
    if result is None or state.checked:
        return state.prefill
    state.checked = True
    if not result.targets:
        state.fallback = "no_prefill_endpoint"
        return None
    if not health.suspect(result.targets[0].id):
        state.prefill = result.targets[0]
        return state.prefill
    by_id = {e.id: e for e in ctx.candidates}
    ranked = [*result.targets, *(by_id[i] for i in sorted(result.totals, key=lambda i: -result.totals[i]) if i in by_id)]
    chosen = next((e for e in ranked if not health.suspect(e.id)), None)
    if chosen is None:
        state.fallback = "prefill_unhealthy"
        result.targets = []
        return None
    state.repicked = True
    result.targets = [chosen, *(e for e in result.targets if e.id != chosen.id)]
    state.prefill = chosen
    return chosen


def decision_type(encode_used: bool, prefill_used: bool) -> str:
    """llm-d's ``DisaggDecisionType``."""
    if encode_used and prefill_used:
        return "encode-prefill-decode"
    if encode_used:
        return "encode-decode"
    if prefill_used:
        return "prefill-decode"
    return "decode-only"


def set_disagg_headers(
    ctx: SchedulingContext, result: SchedulingResult, prefill_profile: str, encode_profile: str, owner: str
) -> None:
    """``x-prefiller-host-port`` (the prefill pick) and ``x-encoder-hosts-ports`` (every encode
    pick) for the sidecar; an inbound value of either is dropped."""
    for name in (PREFILL_HEADER, ENCODER_HEADER):
        if name not in result.remove_headers:
            result.remove_headers.append(name)
    prefill = result.profile_results.get(prefill_profile)
    if prefill is not None and prefill.targets:
        result.add_header(PREFILL_HEADER, destination_host_port(prefill.targets[0].id))
        ctx.put(_PREFILLER.of(owner), prefill.targets[0].id)
    encode = result.profile_results.get(encode_profile)
    if encode is not None and encode.targets:
        result.add_header(ENCODER_HEADER, ",".join(destination_host_port(e.id) for e in encode.targets))


def prefill_failed(ctx: SchedulingContext, info: ResponseInfo, owner: str, health: EndpointHealth) -> None:
    """A disaggregated request's answer is evidence about its prefill endpoint: a gateway error
    the sidecar relays, or its word that it prefilled locally instead, holds it down; a success
    clears its failure streak."""
    prefiller = ctx.get(_PREFILLER.of(owner))
    if prefiller is None or ctx.dry_run:
        return
    if info.status in _PREFILL_LEG_FAILURES or info.prefill_fallback is not None:
        health.upstream(prefiller, False)
    elif 0 < info.status < 400 and not info.cancelled:
        health.upstream(prefiller, True)


class DecisionCounters:
    """``(family, model, decision)`` → requests, bounded; read at scrape time."""

    def __init__(self) -> None:
        self.counts: dict[tuple[str, str, str], int] = {}

    def add(self, family: str, model: str, decision: str) -> None:
        key = (family, model or "unknown", decision)
        if key not in self.counts and len(self.counts) >= _MAX_SERIES:
            key = (family, "other", decision)
        self.counts[key] = self.counts.get(key, 0) + 1

    def record(self, family: str, model: str, decision: str, state: StageState) -> None:
        """The decision, and the prefill fallback or re-pick behind it."""
        self.add(family, model, decision)
        if state.fallback is not None:
            self.add("prefill_fallback", model, state.fallback)
        elif state.repicked:
            self.add("prefill_repick", model, "unhealthy")
