"""``requestHandler.parsers`` at the ext_proc stream: which request paths are handled.

Follows ``llm-d/llm-d-router: pkg/epp/framework/plugins/requesthandling/parsers/`` and the parser
registry of ``pkg/epp/config/loader/configloader.go``: without a list every path is handled (the
default list ends with the passthrough parser); an explicit list has no fallback, so a path no
listed parser claims is answered 400.
"""

from __future__ import annotations

import asyncio

import pytest
from epp_helpers import extproc_request, load, router_for
from integration.extproc.harness import set_headers

from ppc_extproc.framework import Endpoint

ENDPOINT = Endpoint("10.0.0.1", 8000)
COMPLETION = b'{"model": "m", "prompt": [1, 2, 3]}'
MESSAGES = b'{"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}'


def outcome(parsers: str, path: str, payload: bytes) -> tuple[int, str]:
    """(HTTP status of an immediate response or 200 when routed, the body or the destination)."""
    loaded = load(f"plugins: [{{type: random-picker}}]\n{parsers}")
    replies = asyncio.run(extproc_request(router_for(loaded, [ENDPOINT]), path, payload))
    first = replies[0]
    if first.HasField("immediate_response"):
        return first.immediate_response.status.code, first.immediate_response.body.decode()
    return 200, set_headers(first)["x-gateway-destination-endpoint"]


OPENAI_ONLY = "requestHandler: {parsers: [{pluginRef: openai-parser}]}\n"


@pytest.mark.parametrize(
    ("path", "payload"),
    [
        ("/v1/completions", COMPLETION),
        ("/v1/chat/completions?api-version=1", b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'),
        ("/gateway/tenant-a/v1/completions", COMPLETION),
        ("/v1/embeddings", b'{"model": "m", "input": [1, 2, 3]}'),
    ],
)
def test_an_explicit_list_handles_what_its_parsers_claim(path: str, payload: bytes) -> None:
    assert outcome(OPENAI_ONLY, path, payload) == (200, ENDPOINT.id)


@pytest.mark.parametrize(("path", "payload"), [("/v1/messages", MESSAGES), ("/inference/v1/generate", b'{"model": "m"}'),
                                               ("/v1/anything", COMPLETION)])
def test_an_explicit_list_without_passthrough_answers_other_paths_400(path: str, payload: bytes) -> None:
    status, body = outcome(OPENAI_ONLY, path, payload)
    assert status == 400
    assert body == f"inference error: BadRequest - no configured parser handles the request path {path}"


def test_listing_the_passthrough_parser_restores_the_fallback() -> None:
    parsers = "requestHandler: {parsers: [{pluginRef: openai-parser}, {pluginRef: passthrough-parser}]}\n"
    assert outcome(parsers, "/v1/anything", COMPLETION) == (200, ENDPOINT.id)


def test_the_anthropic_parser_claims_messages_and_count_tokens() -> None:
    parsers = "requestHandler: {parsers: [{pluginRef: anthropic-parser}]}\n"
    assert outcome(parsers, "/v1/messages", MESSAGES)[0] == 200
    assert outcome(parsers, "/v1/messages/count_tokens", MESSAGES)[0] == 200
    assert outcome(parsers, "/v1/completions", COMPLETION)[0] == 400


@pytest.mark.parametrize(
    ("path", "payload"),
    [("/v1/completions", COMPLETION), ("/v1/messages", MESSAGES), ("/inference/v1/generate", b'{"model": "m"}'),
     ("/v1/anything", COMPLETION)],
)
def test_without_a_list_every_path_is_handled(path: str, payload: bytes) -> None:
    assert outcome("", path, payload) == (200, ENDPOINT.id)
