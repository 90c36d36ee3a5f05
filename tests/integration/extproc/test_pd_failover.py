"""P/D over a real gRPC channel (no Envoy): the routing reply names a prefill endpoint, and a
prefill leg that failed moves the next requests to the other prefiller, then to local prefill on
the decode engine — never an error for the client.

The service runs a ``pd-epp-config``-shaped configuration over ``file-discovery`` endpoints whose
``labels`` carry ``llm-d.ai/role``. The routing sidecar answers a failed prefill leg with the
prefill endpoint's status (``llm-d/llm-d-router: pkg/sidecar/proxy/connector_nixlv2.go``); the
test plays that answer on the response path.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from harness import Client, body, headers, response_body, response_headers, running_service, set_headers

from ppc_extproc.server.app import Service

pytestmark = pytest.mark.integration

DECODERS = {"10.2.0.1:8000", "10.2.0.2:8000"}
PREFILLERS = {"10.2.0.11:8000", "10.2.0.12:8000"}
ENDPOINTS = """
- {name: decode-0, address: 10.2.0.1, port: 8000, labels: {llm-d.ai/role: decode}}
- {name: decode-1, address: 10.2.0.2, port: 8000, labels: {llm-d.ai/role: decode}}
- {name: prefill-0, address: 10.2.0.11, port: 8000, labels: {llm-d.ai/role: prefill}}
- {name: prefill-1, address: 10.2.0.12, port: 8000, labels: {llm-d.ai/role: prefill}}
"""
CONFIG = """
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- {{type: file-discovery, parameters: {{path: {path}}}}}
- type: precise-prefix-cache-producer
  parameters:
    tokenProcessorConfig: {{blockSizeTokens: 16}}
    kvEventsConfig: {{discoverPods: false}}
- {{type: prefix-cache-scorer, parameters: {{prefixMatchInfoProducerName: precise-prefix-cache-producer}}}}
- {{type: prefill-filter}}
- {{type: decode-filter}}
- {{type: max-score-picker}}
- type: prefix-based-pd-decider
  parameters: {{nonCachedTokens: 32, prefixMatchInfoProducerName: precise-prefix-cache-producer}}
- {{type: disagg-profile-handler, parameters: {{deciders: {{prefill: prefix-based-pd-decider}}}}}}
dataLayer: {{discovery: {{pluginRef: file-discovery}}}}
schedulingProfiles:
- name: prefill
  plugins: [{{pluginRef: prefill-filter}}, {{pluginRef: max-score-picker}}, {{pluginRef: prefix-cache-scorer, weight: 2}}]
- name: decode
  plugins: [{{pluginRef: decode-filter}}, {{pluginRef: max-score-picker}}, {{pluginRef: prefix-cache-scorer, weight: 2}}]
"""


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    endpoints = tmp_path / "endpoints.yaml"
    endpoints.write_text(ENDPOINTS)
    with running_service(tmp_path, CONFIG.format(path=endpoints), endpoints=None) as svc:
        health = svc.loaded.services.health
        frozen = health.clock()
        health.clock = lambda: frozen  # holds last until the test ends, however slow the machine
        yield svc


@pytest.fixture
def client(service: Service) -> Iterator[Client]:
    c = Client(service.grpc_port)
    yield c
    c.close()


def completion(first: int) -> bytes:
    return orjson.dumps({"model": "m", "prompt": list(range(first, first + 200)), "max_tokens": 8})


def request(client: Client, first: int, status: int = 200) -> dict[str, str]:
    """One request (with an inbound prefill header a client must not choose) and its response;
    the routing reply's headers."""
    replies = client.run([
        headers(extra={"x-prefiller-host-port": "6.6.6.6:1"}), body(completion(first)),
        response_headers(status), response_body(b"{}", eos=True),
    ])  # fmt: skip
    routing = replies[0]
    assert routing.WhichOneof("response") == "request_headers"  # routed, never an immediate error
    assert "x-prefiller-host-port" in routing.request_headers.response.header_mutation.remove_headers
    return set_headers(routing)


def test_a_failed_prefill_leg_moves_requests_to_the_other_prefiller_then_to_local_prefill(
    service: Service, client: Client
) -> None:
    first = request(client, 1000, status=502)  # the sidecar relays the prefill endpoint's 502
    assert first["x-gateway-destination-endpoint"] in DECODERS
    failed = first["x-prefiller-host-port"]
    assert failed in PREFILLERS
    second = request(client, 2000, status=502)
    other = second["x-prefiller-host-port"]
    assert other == (PREFILLERS - {failed}).pop()
    third = request(client, 3000)  # both prefill endpoints held down: the decode engine prefills
    assert "x-prefiller-host-port" not in third
    assert third["x-gateway-destination-endpoint"] in DECODERS
    sample = service.registry.get_sample_value
    fallback = sample("ppc_extproc_pd_prefill_fallback_total",
                      {"plugin_name": "disagg-profile-handler", "model_name": "m", "reason": "no_prefill_endpoint"})  # fmt: skip
    assert fallback == 1
    labels = {"plugin_name": "disagg-profile-handler", "plugin_type": "disagg-profile-handler", "model_name": "m"}
    assert sample("llm_d_epp_disagg_decision_total", {**labels, "decision_type": "prefill-decode"}) == 2
    assert sample("llm_d_epp_disagg_decision_total", {**labels, "decision_type": "decode-only"}) == 1


def test_a_short_prompt_carries_no_prefill_header(client: Client) -> None:
    replies = client.run([headers(), body(orjson.dumps({"model": "m", "prompt": [1, 2, 3], "max_tokens": 2}))])
    routed = set_headers(replies[0])
    assert "x-prefiller-host-port" not in routed and routed["x-gateway-destination-endpoint"] in DECODERS
