"""Helpers of the configuration and plugin tests: load a document, summarise the resolved pipeline,
run ``ppc-extproc check-config`` in a child process, build routers over loaded pipelines."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from envoy.service.ext_proc.v3.external_processor_pb2 import ProcessingResponse
from integration.extproc.harness import body, headers
from prometheus_client import CollectorRegistry

from ppc_extproc.config.epp import LoadedConfig, load_config_text
from ppc_extproc.errors import ConfigError
from ppc_extproc.framework import Endpoint
from ppc_extproc.observability.metrics import Metrics
from ppc_extproc.plugins.producers.token_producer import TokenProducer
from ppc_extproc.plugins.registry import Services
from ppc_extproc.scheduling.pool import EndpointPool
from ppc_extproc.scheduling.router import Router
from ppc_extproc.server.stream import ExtProcStream, StreamOptions

__all__ = [
    "HEADER",
    "check_config",
    "config_error",
    "epp",
    "extproc_request",
    "load",
    "pipeline",
    "router_for",
    "until",
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
        [sys.executable, "-m", "ppc_extproc", "check-config", *map(str, files)],
        capture_output=True, text=True, timeout=120, check=False,
    )


async def extproc_request(router: Router, path: str, payload: bytes) -> list[ProcessingResponse]:
    """One request through an ``ExtProcStream`` (full-duplex: headers, then the whole body): the
    replies up to the routing decision or the immediate error response."""
    stream = ExtProcStream(router, StreamOptions(), Metrics(CollectorRegistry()))
    replies: list[ProcessingResponse] = []
    for message in (headers(path), body(payload)):
        out, close = await stream.handle(message)
        replies.extend(out)
        if close:
            break
    stream.close()
    return replies


async def until(condition: Callable[[], bool], timeout: float = 10.0, interval: float = 0.005) -> None:
    """Wait for ``condition``; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met before the deadline"
        await asyncio.sleep(interval)
