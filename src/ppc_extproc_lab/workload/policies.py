"""Routing policies as service configurations (EndpointPickerConfig mappings).

Names used by the demo and the routing benchmark:

================  =============================================================================
random            ``random-picker`` only
round-robin       ``round-robin-picker`` only
load-only         queue-scorer 2 + kv-cache-utilization-scorer 2, max-score-picker
approximate       approx-prefix-cache-producer + prefix-cache-scorer 3 + kv-util 2 + queue 2
precise           precise producer (speculative off) + prefix-cache-scorer, max-score-picker
precise+spec      the same with ``speculativeIndexing: true``
precise+load      precise + speculative, prefix 3 + kv-util 2 + queue 2 (llm-d's guide weights)
default           the service's embedded default config (``config/default.yaml``)
precise+active    precise + speculative, prefix 3 + active-request 2 in llm-d's formula: the
                  embedded default until round 5
pd                P/D on a cluster of prefill engines and decode pods (sidecar + engine):
                  decode-first ``disagg-profile-handler``, ``prefix-based-pd-decider``
                  (nonCachedTokens 512) on the precise producer (:mod:`~ppc_extproc_lab.workload.pd`)
oracle            no service: the client asks every engine's ``/mock/match`` and sends the
                  request straight to the engine holding the most of it (ties: least loaded)
vllm-router       no service: ``vllm-router`` 0.1.17 ``--policy cache_aware`` in front of the
                  engines (:mod:`~ppc_extproc_lab.workload.peers`)
sglang-router     no service: ``sglang-router`` 0.3.2 ``--policy cache_aware``
vllm-router-kv    no service: ``vllm-router --policy kv_aware``, which reads every engine's KV
                  events (precise, like ours)
================  =============================================================================
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ppc_extproc_lab.workload.clients import Form
from ppc_extproc_lab.workload.peers import PEERS, PeerRouter

__all__ = ["ALL_POLICIES", "BENCHMARK_POLICIES", "Policy", "policy"]

_PRECISE = "precise-prefix-cache-producer"
_APPROX = "approx-prefix-cache-producer"


@dataclass(frozen=True, slots=True)
class Policy:
    name: str
    description: str
    #: The service config; None for the client-side oracle and the peer routers.
    service_config: Mapping[str, Any] | None
    #: A peer router in place of Envoy + the service.
    peer: PeerRouter | None = None
    #: Runs on the P/D layout (``ClusterPlan.pd_roles``): prefill engines, decode pods.
    pd: bool = False

    @property
    def oracle(self) -> bool:
        return self.service_config is None and self.peer is None

    @property
    def ours(self) -> bool:
        """Routed by ppc-extproc (Envoy + the service)."""
        return self.service_config is not None

    @property
    def kind(self) -> str:
        """``ours``, ``peer`` or ``oracle``."""
        return "ours" if self.ours else "peer" if self.peer is not None else "oracle"

    def wire_form(self, form: Form, *, service_reads_text: bool = False) -> Form:
        """The request form this policy is sent when the run's workload is ``form``.

        The same prompt reaches every engine as the same tokens; only the wire form differs:
        ppc-extproc routes text (``text``) only once the service tokenises it
        (``service_reads_text``) and is sent the engine's token ids of that text until then;
        sglang-router rejects token ids and is sent the text instead."""
        if self.ours and form == "text" and not service_reads_text:
            return "tokens"
        if self.peer is not None and form == "tokens" and not self.peer.accepts_token_ids:
            return "text"
        return form


def _config(plugins: Sequence[Mapping[str, Any]], profile: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    config: dict[str, Any] = {
        "apiVersion": "llm-d.ai/v1alpha1",
        "kind": "EndpointPickerConfig",
        "plugins": [dict(p) for p in plugins],
        "schedulingProfiles": [{"name": "default", "plugins": [dict(p) for p in profile]}],
    }
    if any(p["type"] == _PRECISE for p in plugins):  # its KV-event subscribers follow the endpoints
        config["plugins"].insert(0, {"type": "endpoint-notification-source"})
        config["dataLayer"] = {"sources": [
            {"pluginRef": "endpoint-notification-source", "extractors": [{"pluginRef": _PRECISE}]},
        ]}
    return config


def _picker_only(picker: str) -> dict[str, Any]:
    return _config([{"type": picker}], [{"pluginRef": picker}])


def _precise(*, speculative: bool, load: bool) -> dict[str, Any]:
    plugins: list[dict[str, Any]] = [
        {
            "type": _PRECISE,
            "parameters": {"speculativeIndexing": speculative, "speculativeTTL": "2s"},
        },
        {"type": "prefix-cache-scorer", "parameters": {"prefixMatchInfoProducerName": _PRECISE}},
    ]
    profile: list[dict[str, Any]] = [{"pluginRef": "prefix-cache-scorer", "weight": 3}]
    if load:
        plugins += [{"type": "kv-cache-utilization-scorer"}, {"type": "queue-scorer"}]
        profile += [
            {"pluginRef": "kv-cache-utilization-scorer", "weight": 2},
            {"pluginRef": "queue-scorer", "weight": 2},
        ]
    plugins.append({"type": "max-score-picker"})
    profile.append({"pluginRef": "max-score-picker"})
    return _config(plugins, profile)


def _precise_active() -> dict[str, Any]:
    return _config(
        [
            {"type": _PRECISE, "parameters": {"speculativeIndexing": True, "speculativeTTL": "2s"}},
            {"type": "prefix-cache-scorer", "parameters": {"prefixMatchInfoProducerName": _PRECISE}},
            {"type": "active-request-scorer"},
            {"type": "max-score-picker"},
        ],
        [
            {"pluginRef": "prefix-cache-scorer", "weight": 3},
            {"pluginRef": "active-request-scorer", "weight": 2},
            {"pluginRef": "max-score-picker"},
        ],
    )


def _load_only() -> dict[str, Any]:
    return _config(
        [
            {"type": "kv-cache-utilization-scorer"},
            {"type": "queue-scorer"},
            {"type": "max-score-picker"},
        ],
        [
            {"pluginRef": "kv-cache-utilization-scorer", "weight": 2},
            {"pluginRef": "queue-scorer", "weight": 2},
            {"pluginRef": "max-score-picker"},
        ],
    )


def _approximate(block_size: int) -> dict[str, Any]:
    return _config(
        [
            {"type": _APPROX, "parameters": {"blockSizeTokens": max(64, block_size)}},
            {"type": "prefix-cache-scorer", "parameters": {"prefixMatchInfoProducerName": _APPROX}},
            {"type": "kv-cache-utilization-scorer"},
            {"type": "queue-scorer"},
            {"type": "max-score-picker"},
        ],
        [
            {"pluginRef": "prefix-cache-scorer", "weight": 3},
            {"pluginRef": "kv-cache-utilization-scorer", "weight": 2},
            {"pluginRef": "queue-scorer", "weight": 2},
            {"pluginRef": "max-score-picker"},
        ],
    )


def _service_default(block_size: int) -> dict[str, Any]:
    from ppc_extproc_lab.localcluster.service_config import default_service_config

    return default_service_config(block_size=block_size)


_DESCRIPTIONS = {
    "random": "random-picker",
    "round-robin": "round-robin-picker",
    "load-only": "queue 2 + kv-util 2",
    "approximate": "approx producer: prefix 3 + kv-util 2 + queue 2",
    "precise": "precise producer: prefix only, no speculation",
    "precise+spec": "precise producer + speculative indexing: prefix only",
    "precise+load": "precise + speculative: prefix 3 + kv-util 2 + queue 2",
    "default": "service default (config/default.yaml)",
    "precise+active": "precise + speculative: prefix 3 + active-request 2 (the default until round 5)",
    "pd": "P/D: decode-first, prefix-based decider (512 uncached tokens), precise + speculative",
    "oracle": "client reads every engine's cache (/mock/match), most cached wins, ties least loaded",
    "vllm-router": "vllm-router 0.1.17 --policy cache_aware (approximate text tree + shortest queue)",
    "sglang-router": "sglang-router 0.3.2 --policy cache_aware (approximate text tree + shortest queue)",
    "vllm-router-kv": "vllm-router 0.1.17 --policy kv_aware (the engines' KV events, tokens via the worker)",
}
ALL_POLICIES: tuple[str, ...] = tuple(_DESCRIPTIONS)
#: The routing benchmark's default line-up.
BENCHMARK_POLICIES: tuple[str, ...] = (
    "random", "round-robin", "load-only", "approximate", "precise", "precise+spec", "precise+load",
    "oracle",
)  # fmt: skip


def policy(name: str, *, block_size: int = 64) -> Policy:
    """The policy called ``name`` (one of :data:`ALL_POLICIES`)."""
    configs: dict[str, Any] = {
        "random": lambda: _picker_only("random-picker"),
        "round-robin": lambda: _picker_only("round-robin-picker"),
        "load-only": _load_only,
        "approximate": lambda: _approximate(block_size),
        "precise": lambda: _precise(speculative=False, load=False),
        "precise+spec": lambda: _precise(speculative=True, load=False),
        "precise+load": lambda: _precise(speculative=True, load=True),
        "default": lambda: _service_default(block_size),
        "precise+active": _precise_active,
        "oracle": lambda: None,
    }
    if name in PEERS:
        return Policy(name, _DESCRIPTIONS[name], None, PEERS[name])
    if name == "pd":
        from ppc_extproc_lab.workload.pd import pd_config

        return Policy(name, _DESCRIPTIONS[name], pd_config(), pd=True)
    if name not in configs:
        raise ValueError(f"unknown policy {name!r}; choose from {', '.join(ALL_POLICIES)}")
    return Policy(name, _DESCRIPTIONS[name], configs[name]())
