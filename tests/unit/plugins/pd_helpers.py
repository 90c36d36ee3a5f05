"""Helpers of the P/D plugin tests: labelled endpoints, a pd-epp-config-like document, a router
whose pool also feeds endpoint health (as the service wires it)."""

from __future__ import annotations

import asyncio

from epp_helpers import load

from ppc_extproc.config.epp import LoadedConfig
from ppc_extproc.framework import Endpoint, LLMRequest
from ppc_extproc.plugins.filters.role import ROLE_LABEL
from ppc_extproc.scheduling.pool import EndpointPool
from ppc_extproc.scheduling.router import Decision, Router
from ppc_extproc.tokens import TokenizedPrompt
from ppc_extproc.tokens.le32 import tokens_to_le32

__all__ = ["DECODERS", "PD_CONFIG", "PREFILLERS", "decide", "pd_config", "pod", "prompt", "router"]


def pod(i: int, role: str | None, port: int = 8000, **labels: str) -> Endpoint:
    all_labels = dict(labels)
    if role is not None:
        all_labels[ROLE_LABEL] = role
    return Endpoint(f"10.0.0.{i}", port, name=f"pod-{i}", labels=tuple(sorted(all_labels.items())))


DECODERS = [pod(1, "decode"), pod(2, "decode")]
PREFILLERS = [pod(11, "prefill"), pod(12, "prefill")]

#: ``pd-epp-config`` with a handler parameter block to fill in (``{handler}``).
PD_CONFIG = """
plugins:
- {{type: approx-prefix-cache-producer, parameters: {{blockSizeTokens: 64}}}}
- {{type: prefix-cache-scorer}}
- {{type: prefill-filter}}
- {{type: decode-filter}}
- {{type: max-score-picker}}
- {{type: disagg-profile-handler, parameters: {handler}}}
- {{type: prefix-based-pd-decider, parameters: {{nonCachedTokens: {threshold}}}}}
schedulingProfiles:
- name: prefill
  plugins: [{{pluginRef: prefill-filter}}, {{pluginRef: max-score-picker}}, {{pluginRef: prefix-cache-scorer, weight: 2}}]
- name: decode
  plugins: [{{pluginRef: decode-filter}}, {{pluginRef: max-score-picker}}, {{pluginRef: prefix-cache-scorer, weight: 2}}]
"""


def pd_config(handler: str = "{deciders: {prefill: prefix-based-pd-decider}}", threshold: int = 16) -> LoadedConfig:
    return load(PD_CONFIG.format(handler=handler, threshold=threshold))


def router(loaded: LoadedConfig, endpoints: list[Endpoint] | None = None) -> Router:
    """The service's wiring: health and the data layer follow the pool."""
    pool = EndpointPool()
    health = loaded.services.health
    pool.subscribe(health.on_endpoint_event)
    pool.subscribe(loaded.data_layer.notify)
    pool.replace(endpoints if endpoints is not None else [*DECODERS, *PREFILLERS])
    return Router(pool, loaded.pipeline, loaded.services.inflight, health)


def prompt(n: int, start: int = 0, model: str = "m") -> TokenizedPrompt:
    return TokenizedPrompt(model, (tokens_to_le32(range(start, start + n)),))


def decide(r: Router, tokens: TokenizedPrompt, request_id: str = "r") -> Decision:
    return asyncio.run(r.route(LLMRequest(request_id, tokens.model, tokens)))
