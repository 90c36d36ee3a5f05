"""P/D routing policies: llm-d's decode-first disaggregation over the precise producer.

The profiles are llm-d's ``pd-epp-config`` (``llm-d/llm-d-router: deploy/config/pd-epp-config.yaml``)
with the precise producer in place of the approximate one and this service's default weights
(prefix 3 + active-request 2): the decode profile picks among decode pods, the
``prefix-based-pd-decider`` judges its pick, and on "yes" the prefill profile picks a prefiller,
named to the decode pod's sidecar in ``x-prefiller-host-port``.
"""

from __future__ import annotations

from typing import Any, Final

__all__ = ["DEFAULT_NON_CACHED_TOKENS", "pd_config"]

_PRECISE: Final = "precise-prefix-cache-producer"
#: Disaggregate when at least this many prompt tokens are not cached on the decode pick.
DEFAULT_NON_CACHED_TOKENS: Final = 512


def _profile(name: str, role_filter: str) -> dict[str, Any]:
    return {
        "name": name,
        "plugins": [
            {"pluginRef": role_filter},
            {"pluginRef": "prefix-cache-scorer", "weight": 3},
            {"pluginRef": "active-request-scorer", "weight": 2},
            {"pluginRef": "max-score-picker"},
        ],
    }


def pd_config(
    *,
    non_cached_tokens: int = DEFAULT_NON_CACHED_TOKENS,
    speculative_ttl: str = "2s",
    speculative_indexing: bool = True,
    credit_decode_engine: bool = True,
    decode_credit_ttl: str = "120s",
) -> dict[str, Any]:
    """The service config of the ``pd`` policy: the precise producer's ``speculativeIndexing``,
    ``speculativeTTL``, ``creditDecodeEngine`` (false: llm-d's behaviour, a decode engine never
    credited with the prompt it received) and ``decodeCreditTTL``."""
    precise = {
        "speculativeIndexing": speculative_indexing,
        "speculativeTTL": speculative_ttl,
        "creditDecodeEngine": credit_decode_engine,
        "decodeCreditTTL": decode_credit_ttl,
    }
    return {
        "apiVersion": "llm-d.ai/v1alpha1",
        "kind": "EndpointPickerConfig",
        "plugins": [
            {"type": "endpoint-notification-source"},
            {"type": "token-producer", "parameters": {"local": {}}},
            {"type": _PRECISE, "parameters": precise},
            {"type": "prefix-cache-scorer", "parameters": {"prefixMatchInfoProducerName": _PRECISE}},
            {"type": "active-request-scorer"},
            {"type": "prefill-filter"},
            {"type": "decode-filter"},
            {"type": "max-score-picker"},
            {
                "type": "prefix-based-pd-decider",
                "parameters": {"nonCachedTokens": non_cached_tokens, "prefixMatchInfoProducerName": _PRECISE},
            },
            {"type": "disagg-profile-handler", "parameters": {"deciders": {"prefill": "prefix-based-pd-decider"}}},
        ],
        "dataLayer": {
            "sources": [{"pluginRef": "endpoint-notification-source", "extractors": [{"pluginRef": _PRECISE}]}]
        },
        "schedulingProfiles": [_profile("prefill", "prefill-filter"), _profile("decode", "decode-filter")],
    }
