"""A stream built with ``defer_records`` hands back its routing reply before it records the
decision (the servicer records it once the reply is sent); what is recorded is the same."""

from __future__ import annotations

import asyncio
from typing import Any

from integration.extproc.harness import BUFFERED, body, headers
from prometheus_client import CollectorRegistry

from ppc_extproc.config.epp import load_config_text
from ppc_extproc.framework import Endpoint
from ppc_extproc.observability.metrics import Metrics
from ppc_extproc.plugins.registry import Services
from ppc_extproc.scheduling.pool import EndpointPool
from ppc_extproc.scheduling.router import Router
from ppc_extproc.server.stream import ExtProcStream, StreamOptions

CONFIG = """
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: random-picker
"""
REQUEST = b'{"model": "m", "prompt": [1, 2, 3]}'


def router() -> Router:
    services = Services()
    loaded = load_config_text(CONFIG, services=services)
    pool = EndpointPool()
    pool.replace([Endpoint("10.0.0.1", 8000)])
    return Router(pool, loaded.pipeline, inflight=services.inflight, health=services.health)


def decisions_total(metrics: Metrics) -> float:
    return sum(s.value for m in metrics.decision.collect() for s in m.samples if s.name.endswith("_count"))


def test_records_wait_for_run_deferred_and_say_the_same() -> None:
    async def run() -> tuple[list[dict[str, Any]], list[dict[str, Any]], float, list[dict[str, Any]]]:
        kept: list[dict[str, Any]] = []
        metrics = Metrics(CollectorRegistry())
        stream = ExtProcStream(router(), StreamOptions(), metrics, kept.append, defer_records=True)
        await stream.handle(headers(mode=BUFFERED, extra={"x-request-id": "r1"}))
        replies, _ = await stream.handle(body(REQUEST))
        assert replies and replies[0].WhichOneof("response") == "request_body"
        before = list(kept)
        assert decisions_total(metrics) == 0
        stream.run_deferred()
        stream.run_deferred()  # once only
        inline: list[dict[str, Any]] = []
        other = ExtProcStream(router(), StreamOptions(), Metrics(CollectorRegistry()), inline.append)
        await other.handle(headers(mode=BUFFERED, extra={"x-request-id": "r1"}))
        await other.handle(body(REQUEST))
        return before, kept, decisions_total(metrics), inline

    before, kept, observed, inline = asyncio.run(run())
    assert before == [] and observed == 1
    assert len(kept) == 1 and kept[0]["requestId"] == "r1" and kept[0]["destination"] == "10.0.0.1:8000"
    # The same record as a stream that records at once, but for the measured time.
    assert {k: v for k, v in kept[0].items() if k != "decisionMs"} == {k: v for k, v in inline[0].items() if k != "decisionMs"}


def test_close_records_what_was_left() -> None:
    async def run() -> list[dict[str, Any]]:
        kept: list[dict[str, Any]] = []
        stream = ExtProcStream(router(), StreamOptions(), Metrics(CollectorRegistry()), kept.append, defer_records=True)
        await stream.handle(headers(mode=BUFFERED))
        await stream.handle(body(REQUEST))
        stream.close(cancelled=True)
        return kept

    assert len(asyncio.run(run())) == 1
