"""The service config a local cluster writes: KV-event subscribers pointed at the local engines.

The cluster passes ``--config-file`` to ``ppc-extproc serve``. The file is the user's config (a
mapping or a YAML path) or :func:`default_service_config`, with the ports of the engines' KV-event
publishers patched in by :func:`patch_service_config`.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import structlog
import yaml

from ppc_extproc.config.epp import default_config_text

__all__ = ["PRECISE_PRODUCER", "default_service_config", "patch_service_config", "with_redis_syncer"]

log = structlog.get_logger(__name__)

PRECISE_PRODUCER = "precise-prefix-cache-producer"
TOKEN_PRODUCER_TYPES = ("token-producer", "tokenizer")


def default_service_config(*, block_size: int | None = None) -> dict[str, Any]:
    """The service's own embedded default configuration (``config/default.yaml``), optionally with
    another canonical block size."""
    config: dict[str, Any] = yaml.safe_load(default_config_text())
    if block_size is not None:
        for plugin in config["plugins"]:
            if plugin.get("type") == PRECISE_PRODUCER:
                params = plugin.setdefault("parameters", {})
                params.setdefault("tokenProcessorConfig", {})["blockSizeTokens"] = block_size
    return config


def patch_service_config(
    config: Mapping[str, Any],
    *,
    socket_port: int,
    replay_socket_port: int,
    block_size: int | None = None,
    tokenizer: str | None = None,
) -> dict[str, Any]:
    """A copy of ``config`` whose KV-event subscribers dial the local engines' ports.

    Sets ``kvEventsConfig.podDiscoveryConfig.socketPort`` / ``replaySocketPort`` in every
    ``precise-prefix-cache-producer`` plugin (and in a top-level ``kvEventsConfig``, if any),
    ``tokenProcessorConfig.blockSizeTokens`` when ``block_size`` is given, and — with a
    ``tokenizer`` directory — ``local.tokenizerPath`` on a local token producer that names no
    directory (the embedded default's), or a local ``token-producer`` on it when none is configured.
    """
    out: dict[str, Any] = copy.deepcopy(dict(config))
    plugins = out.get("plugins") or []
    producers = [p for p in plugins if isinstance(p, dict) and p.get("type") in TOKEN_PRODUCER_TYPES]
    if tokenizer is not None and not producers:
        out["plugins"] = [{"type": "token-producer", "parameters": {"local": {"tokenizerPath": tokenizer}}}, *plugins]
    elif tokenizer is not None:
        for producer in producers:
            local = (producer.get("parameters") or {}).get("local")
            if isinstance(local, dict) and not local.get("tokenizerPath") and not local.get("tokenizers"):
                local["tokenizerPath"] = tokenizer
    targets: list[dict[str, Any]] = []
    for plugin in out.get("plugins") or []:
        if isinstance(plugin, dict) and plugin.get("type") == PRECISE_PRODUCER:
            params = plugin.get("parameters")
            if not isinstance(params, dict):
                params = plugin["parameters"] = {}
            targets.append(params)
    if isinstance(out.get("kvEventsConfig"), dict):
        targets.append(out)
    if not targets:
        log.debug("service_config_without_kv_events", plugin_type=PRECISE_PRODUCER)
    for params in targets:
        discovery = params.setdefault("kvEventsConfig", {}).setdefault("podDiscoveryConfig", {})
        discovery["socketPort"] = socket_port
        discovery["replaySocketPort"] = replay_socket_port
        if block_size is not None:
            params.setdefault("tokenProcessorConfig", {})["blockSizeTokens"] = block_size
    return out


def with_redis_syncer(
    config: Mapping[str, Any], address: str, *, sync_interval: str = "200ms", **parameters: Any
) -> dict[str, Any]:
    """A copy of ``config`` whose replicas share state through the store at ``address``: a
    ``redis-syncer`` plugin (with ``parameters``) and ``dataLayer.crossReplicaSyncerPluginRef``."""
    out: dict[str, Any] = copy.deepcopy(dict(config))
    out["plugins"] = [*(out.get("plugins") or []),
                      {"type": "redis-syncer", "parameters": {"address": address, **parameters}}]  # fmt: skip
    layer = out.setdefault("dataLayer", {})
    layer["crossReplicaSyncerPluginRef"] = "redis-syncer"
    layer["crossReplicaSyncInterval"] = sync_interval
    return out
