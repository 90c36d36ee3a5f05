"""Malformed request bodies over a real gRPC channel to the real service (its embedded default
configuration), in every size class and body mode: each gets the reference parser's 400 (same
message), never a 5xx; the service stays alive and routes a well-formed canary after every one."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import fault_tally as tally
import orjson
import pytest
from fault_bodies import CHUNK_BYTES, FAST, SMALL, STREAMED, reference, request_bodies, run, sized
from hypothesis import given
from hypothesis import strategies as st
from integration.extproc.harness import BUFFERED, FULL_DUPLEX, Client, body, headers, running_service, set_headers

from ppc_extproc.server.app import Service

pytestmark = pytest.mark.integration

#: Loopback addresses nothing listens on: the default configuration's KV-event subscribers
#: connect to them in vain, which is all this test needs of them.
PODS = {"127.0.9.11:8000", "127.0.9.12:8000", "127.0.9.13:8000"}
CANARY = orjson.dumps({"model": "m", "prompt": list(range(100, 164)), "max_tokens": 8})


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Service, Client]]:
    endpoints = ",".join(sorted(PODS))
    with running_service(tmp_path_factory.mktemp("bad-bodies"), None, endpoints) as service:  # default config
        grpc_client = Client(service.grpc_port)
        try:
            yield service, grpc_client
        finally:
            grpc_client.close()


def send(grpc_client: Client, path: str, data: bytes, mode: int) -> tuple[Any, ...]:
    """("routed", destination) or ("error", status, body) for one request, sent as Envoy does:
    FULL_DUPLEX_STREAMED in 16 KiB chunks, BUFFERED in one message."""
    chunks = [data[i : i + CHUNK_BYTES] for i in range(0, len(data), CHUNK_BYTES)] if mode == FULL_DUPLEX else [data]
    messages = [headers(path, mode=mode)] + [body(c, eos=i == len(chunks) - 1) for i, c in enumerate(chunks)]
    replies = grpc_client.run(messages)
    for reply in replies:
        kind = reply.WhichOneof("response")
        if kind == "immediate_response":
            return ("error", reply.immediate_response.status.code, reply.immediate_response.body.decode())
        if kind in ("request_headers", "request_body"):
            destination = set_headers(reply, kind).get("x-gateway-destination-endpoint")
            if destination is not None:
                return ("routed", destination)
    raise AssertionError(f"neither routed nor refused: {replies}")


def expected(path: str, data: bytes) -> tuple[Any, ...]:
    result = run(reference, path, data)
    if result[0] == "error":
        return ("error", result[1], f"inference error: BadRequest - {result[2]}")
    return ("routed",)


@tally.campaign(150)
@given(case=request_bodies(), mode=st.sampled_from([FULL_DUPLEX, BUFFERED]))
def test_malformed_bodies_get_a_400_and_the_service_keeps_routing(
    client: tuple[Service, Client], case: tuple[str, bytes], mode: int
) -> None:
    service, grpc_client = client
    path, raw = case
    for size in (SMALL, FAST, STREAMED):
        data = sized(raw, size)
        if not data:
            continue  # an empty body is routed like a header-only request (conformance tests)
        want = expected(path, data)
        got = send(grpc_client, path, data, mode)
        tally.add("gRPC: bodies sent")
        tally.add("gRPC: 5xx answers", int(got[0] == "error" and got[1] >= 500))
        if want[0] == "error":
            tally.add("gRPC: malformed, same 400 as the reference")
            assert got == want, f"{len(data)} bytes, mode {mode}"
        else:
            assert got[0] == "routed" and got[1] in PODS, got
        canary = send(grpc_client, "/v1/completions", CANARY, mode)
        assert canary[0] == "routed" and canary[1] in PODS, canary
        tally.add("gRPC: canaries routed in between")
    assert service.router.inflight is not None


def test_the_campaign_found_no_5xx() -> None:
    """Runs after the campaign (file order): the tally says what it tried."""
    assert tally.counts["gRPC: 5xx answers"] == 0
