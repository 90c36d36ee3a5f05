"""Helpers of the configuration and plugin tests: load a document, summarise the resolved pipeline,
run ``ppc-extproc check-config`` in a child process, build routers over loaded pipelines."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from ppc_extproc.config.epp import LoadedConfig, load_config_text
from ppc_extproc.errors import ConfigError
from ppc_extproc.framework import Endpoint
from ppc_extproc.plugins.producers.token_producer import TokenProducer
from ppc_extproc.plugins.registry import Services
from ppc_extproc.scheduling.pool import EndpointPool
from ppc_extproc.scheduling.router import Router

__all__ = [
    "HEADER",
    "check_config",
    "config_error",
    "epp",
    "load",
    "pipeline",
    "router_for",
]

HEADER = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n"


def epp(body: str, api_version: str = "llm-d.ai/v1alpha1") -> str:
    """A document: the header (with ``api_version``) and ``body`` (dedented)."""
    return f"apiVersion: {api_version}\nkind: EndpointPickerConfig\n" + textwrap.dedent(body)


def load(body: str, services: Services | None = None) -> LoadedConfig:
    """Load ``body`` (without header) as a document."""
    return load_config_text(epp(body), services=services)


def config_error(text: str) -> ConfigError:
    """The error loading ``text`` (a whole document) raises."""
    with pytest.raises(ConfigError) as info:
        load_config_text(text)
    return info.value


def _label(plugin: Any) -> str:
    if isinstance(plugin, TokenProducer):
        return f"{plugin.name}[{plugin.backend_name}]"
    return str(plugin.name)


def pipeline(loaded: LoadedConfig) -> dict[str, Any]:
    """What a loaded configuration runs, by plugin name: the handler, each profile's filters,
    weighted scorers and picker, the producers in run order (token producers with their backend)
    and every data source with its extractors."""
    profiles = {
        p.name: {
            "filters": [f.name for f in p.filters],
            "scorers": [(w.scorer.name, w.weight) for w in p.scorers],
            "picker": p.picker.name,
        }
        for p in loaded.profiles.values()
    }
    sources = {
        s.name: [e.name for e in s.extractors]
        for s in (*loaded.data_layer.endpoint_sources, *loaded.data_layer.polling_sources)
    }
    return {
        "handler": loaded.handler.name,
        "profiles": profiles,
        "producers": [_label(step.producer) for step in loaded.pipeline.producers],
        "sources": sources,
    }


def router_for(loaded: LoadedConfig, endpoints: Sequence[Endpoint]) -> Router:
    """A router over ``loaded``'s pipeline and a pool holding ``endpoints`` (the data layer is
    subscribed to the pool, as the service does)."""
    pool = EndpointPool()
    pool.subscribe(loaded.data_layer.notify)
    pool.replace(endpoints)
    return Router(pool, loaded.pipeline, loaded.services.inflight)


def check_config(*files: Path) -> subprocess.CompletedProcess[str]:
    """``ppc-extproc check-config FILE…`` in a child process (it configures logging globally)."""
    return subprocess.run(
        [sys.executable, "-m", "ppc_extproc.cli", "check-config", *map(str, files)],
        capture_output=True, text=True, timeout=120, check=False,
    )
