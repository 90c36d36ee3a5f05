"""The response path reads Envoy's ``response_attributes`` to tell a connection failure (the
endpoint is held down) from the engine's own error (it is not). The attribute values are what
Envoy 1.40 sent in the response-headers message (BUFFERED and FULL_DUPLEX_STREAMED alike) for a
stub engine answering 503, a closed port, a server that closed the connection at once, and (route
timeout 1 s) an engine that did not answer in time — not a connection failure."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from envoy.config.core.v3.base_pb2 import HeaderMap, HeaderValue
from envoy.service.ext_proc.v3.external_processor_pb2 import HttpHeaders, ProcessingRequest
from integration.extproc.harness import body, headers
from prometheus_client import CollectorRegistry

from ppc_extproc.config.epp import load_config_text
from ppc_extproc.framework import Endpoint
from ppc_extproc.observability.metrics import Metrics
from ppc_extproc.plugins.registry import Services
from ppc_extproc.scheduling.pool import EndpointPool
from ppc_extproc.scheduling.router import Router
from ppc_extproc.server.stream import ExtProcStream, StreamOptions

A = Endpoint("10.0.0.1", 8000)
CONFIG = """
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: random-picker
"""
ENGINE_503 = {"response.code": 503.0, "response.code_details": "via_upstream", "response.flags": 0.0}
REFUSED = {
    "response.code": 503.0, "response.flags": 32.0,
    "response.code_details":
        "upstream_reset_before_response_started{remote_connection_failure|delayed_connect_error:_Connection_refused}",
}
CLOSED_AT_ONCE = {
    "response.code": 503.0, "response.flags": 64.0,
    "response.code_details": "upstream_reset_before_response_started{connection_termination}",
}
TIMEOUT = {"response.code": 504.0, "response.flags": 4.0, "response.code_details": "response_timeout"}


def router() -> Router:
    services = Services()
    loaded = load_config_text(CONFIG, services=services)
    pool = EndpointPool()
    pool.subscribe(services.health.on_endpoint_event)
    pool.replace([A])
    return Router(pool, loaded.pipeline, inflight=services.inflight, health=services.health)


def response_headers(status: int, attributes: dict[str, Any] | None, *, upstream_time: bool = False) -> ProcessingRequest:
    values = [HeaderValue(key=":status", raw_value=str(status).encode())]
    if upstream_time:
        values.append(HeaderValue(key="x-envoy-upstream-service-time", raw_value=b"3"))
    message = ProcessingRequest(response_headers=HttpHeaders(headers=HeaderMap(headers=values)))
    if attributes is not None:
        message.attributes["envoy.filters.http.ext_proc"].update(attributes)
    return message


def respond(r: Router, reply: ProcessingRequest) -> None:
    async def run() -> None:
        stream = ExtProcStream(r, StreamOptions(), Metrics(CollectorRegistry()))
        for message in (headers("/v1/completions"), body(b'{"model": "m", "prompt": [1, 2, 3]}'), reply):
            _, close = await stream.handle(message)
            assert not close
        stream.close()

    asyncio.run(run())


@pytest.mark.parametrize(
    ("attributes", "held"),
    [(ENGINE_503, False), (REFUSED, True), (CLOSED_AT_ONCE, True), (TIMEOUT, False)],
    ids=["engine-503", "connect-refused", "closed-before-response", "upstream-timeout"],
)
def test_only_a_connection_failure_holds_the_endpoint(attributes: dict[str, Any], held: bool) -> None:
    r = router()
    respond(r, response_headers(int(attributes["response.code"]), attributes))
    assert (A.id in r.health.down()) is held


def test_without_attributes_a_503_is_no_evidence() -> None:
    """An Envoy config that does not ask for the attributes, with suppress_envoy_headers: the
    service cannot tell, so it never takes the endpoint down."""
    r = router()
    respond(r, response_headers(503, None))
    assert r.health.down() == {}
    respond(r, response_headers(503, None, upstream_time=True))
    assert r.health.down() == {}
