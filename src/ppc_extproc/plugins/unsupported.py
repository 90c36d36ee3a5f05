"""llm-d plugin types ppc-extproc does not implement, each with what it does.

Loading one is an error naming the type, its category and its purpose, so a user knows at once
whether the configuration can run here. Descriptions follow the plugins' READMEs in
``llm-d/llm-d-router: pkg/epp/framework/plugins/``.
"""

from __future__ import annotations

__all__ = ["UNSUPPORTED_TYPES", "unsupported_message"]

_PD = "P/D disaggregation"
_FLOW = "flow control"
_ADMISSION = "admission"
_GPU = "GPU telemetry"
_LATENCY = "latency prediction"
_OTHER = "routing"

#: type → (category, what it does)
UNSUPPORTED_TYPES: dict[str, tuple[str, str]] = {
    "disaggregatedset-rollout-pod-extractor": (_PD, "reads disaggregated-set rollout state from pods"),
    "disaggregatedset-rollout-screener": (_PD, "screens requests during a disaggregated-set rollout"),
    "latency-slo-admitter": (_ADMISSION, "rejects requests whose predicted latency misses their SLO"),
    "sheddable-filter": (_FLOW, "selects sheddable requests for eviction"),
    "priority-then-time-ordering": (_FLOW, "eviction order by priority, then age"),
    "utilization-filter": (_GPU, "drops endpoints above a utilisation threshold"),
    "predicted-latency-producer": (_LATENCY, "predicts TTFT and TPOT per endpoint with a trained model"),
    "latency-scorer": (_LATENCY, "scores endpoints by predicted latency"),
    "slo-headroom-tier-filter": (_LATENCY, "keeps endpoints with SLO headroom"),
    "label-selector-filter": (_OTHER, "keeps endpoints matching a label selector"),
    "by-label": (_OTHER, "deprecated alias of label-selector-filter"),
    "by-label-selector": (_OTHER, "deprecated alias of label-selector-filter"),
    "header-label-affinity-scorer": (_OTHER, "prefers endpoints whose labels match request headers"),
    "header-profile-handler": (_OTHER, "picks the scheduling profile from a request header"),
    "context-length-aware": (_OTHER, "routes by prompt length to endpoints sized for it"),
    "models-data-source": (_OTHER, "polls engines' /v1/models"),
    "models-data-extractor": (_OTHER, "reads the served models per endpoint"),
    "request-attribute-reporter": (_OTHER, "reports request attributes to the data plane"),
    "vllmgrpc-parser": (_OTHER, "parses vLLM's gRPC engine protocol"),
    "vertexai-parser": (_OTHER, "parses Vertex AI request bodies"),
    "cross-replica-publisher": (_OTHER, "publishes state to other EPP replicas"),
    "k8s-notification-source": (_OTHER, "Kubernetes object notifications for extractors"),
}


def unsupported_message(type_name: str) -> str | None:
    """The error for an llm-d type ppc-extproc does not implement; None for unknown types."""
    known = UNSUPPORTED_TYPES.get(type_name)
    if known is None:
        return None
    category, description = known
    return (
        f"plugin type {type_name!r} ({category}: {description}) is an llm-d plugin not implemented "
        "by ppc-extproc yet"
    )
