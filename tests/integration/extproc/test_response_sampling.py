"""The response path when Envoy sends no response bodies (envoy/envoy.yaml): one message each way,
in-flight accounting ending with the stream, and usage read from a sample of responses that the
service switches to STREAMED with ``mode_override``."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import orjson
import pytest
from harness import BUFFERED, FULL_DUPLEX, Client, body, headers, response_body, response_headers, running_service

from ppc_extproc.server.app import Service
from ppc_extproc_lab.localcluster import wait_for

pytestmark = pytest.mark.integration

NONE = 0
STREAMED = 1
USAGE = orjson.dumps({"usage": {"prompt_tokens": 64, "completion_tokens": 4, "prompt_tokens_details": {"cached_tokens": 0}}})


def completion() -> bytes:
    return orjson.dumps({"model": "m", "prompt": list(range(100, 164)), "max_tokens": 4})


def _request(client: Client, *, mode: int = BUFFERED, response_mode: int = NONE, with_body: bool = False) -> list:
    messages = [headers(mode=mode, response_mode=response_mode), body(completion()), response_headers()]
    if with_body:
        messages += [response_body(USAGE[:10]), response_body(USAGE[10:], eos=True)]
    return client.run(messages)


def _overrides(replies: list) -> list:
    return [r.mode_override for r in replies if r.HasField("mode_override")]


@contextmanager
def _serving(tmp_path: Path, rate: float) -> Iterator[tuple[Service, Client]]:
    with running_service(tmp_path, usage_sample_rate=rate) as service:
        client = Client(service.grpc_port)
        try:
            yield service, client
        finally:
            client.close()


def _routed(service) -> float:
    return service.metrics.requests.labels("routed", "200")._value.get()


def test_unsampled_request_gets_one_reply_and_ends_with_the_stream(tmp_path: Path) -> None:
    with _serving(tmp_path, 0.0) as (service, client):
        replies = _request(client)
        assert [r.WhichOneof("response") for r in replies] == ["request_headers", "request_body", "response_headers"]
        assert _overrides(replies) == []
        # The stream's end (Envoy ends it when the HTTP response completes) ends the request.
        wait_for(lambda: _routed(service) == 1, what="the request to be counted", timeout=5)
        assert all(v["requests"] == 0 for v in service.router.inflight.snapshot().values())
        assert service.metrics.usage_tokens.labels("prompt")._value.get() == 0


def test_sampled_request_asks_for_its_body_and_records_usage(tmp_path: Path) -> None:
    with _serving(tmp_path, 1.0) as (service, client):
        replies = _request(client, with_body=True)
        (override,) = _overrides(replies)
        assert override.response_body_mode == STREAMED
        assert replies[2].WhichOneof("response") == "response_headers"
        assert [r.WhichOneof("response") for r in replies[3:]] == ["response_body", "response_body"]
        wait_for(lambda: _routed(service) == 1, what="the request to be counted", timeout=5)
        assert service.metrics.usage_tokens.labels("prompt")._value.get() == 64
        assert service.metrics.usage_tokens.labels("completion")._value.get() == 4
        assert all(v["requests"] == 0 for v in service.router.inflight.snapshot().values())


def test_sample_rate_picks_that_share_of_requests(tmp_path: Path) -> None:
    with _serving(tmp_path, 0.25) as (service, client):
        sampled = sum(len(_overrides(_request(client))) for _ in range(8))
        assert sampled == 2
        assert service.extproc.sampler.seen == 8


@pytest.mark.parametrize(("mode", "response_mode"), [(FULL_DUPLEX, NONE), (BUFFERED, STREAMED), (FULL_DUPLEX, FULL_DUPLEX)])
def test_no_override_where_envoy_sends_bodies_or_would_ignore_it(tmp_path: Path, mode: int, response_mode: int) -> None:
    """Envoy ignores mode_override with a FULL_DUPLEX_STREAMED request body; where response bodies
    are configured on, every response is read and nothing is asked for."""
    with _serving(tmp_path, 1.0) as (_, client):
        assert _overrides(_request(client, mode=mode, response_mode=response_mode)) == []
