"""The ext_proc stream and ``POST /debug/score`` route the same request: for every path of the path
table, both rewrite headers, token-id, text and chat bodies, the two agree on the pick, the token
count and the refusals (a path no configured parser claims, a malformed body)."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import orjson
import pytest
from harness import (
    BUFFERED,
    Client,
    body,
    headers,
    metadata_destination,
    response_body,
    response_headers,
    running_service,
)

from ppc_extproc.tokens.paths import ROUTES
from ppc_extproc_lab.tiny_tokenizer import build_tiny_tokenizer

pytestmark = pytest.mark.integration

PODS = "10.3.0.1:8000,10.3.0.2:8000,10.3.0.3:8000"
CONFIG = """
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: token-producer
  parameters: {{local: {{tokenizers: {{m: "{tokenizer}", m-served: "{tokenizer}"}}, engineRender: false}}}}
- type: precise-prefix-cache-producer
  parameters: {{speculativeIndexing: true, kvEventsConfig: {{discoverPods: false}}}}
- type: prefix-cache-scorer
  parameters: {{prefixMatchInfoProducerName: precise-prefix-cache-producer}}
- type: openai-parser
- type: vllmhttp-parser
requestHandler:
  parsers: [{{pluginRef: openai-parser}}, {{pluginRef: vllmhttp-parser}}]
schedulingProfiles:
- name: default
  plugins: [{{pluginRef: prefix-cache-scorer}}]
"""

TOKENS = list(range(3, 200))
CHAT = [{"role": "system", "content": "You are terse. " * 20}, {"role": "user", "content": "Say hello to the cache."}]


def _body_for(suffix: str) -> dict[str, object]:
    if suffix.endswith("/generate") and suffix.startswith("/inference"):
        return {"model": "m", "token_ids": TOKENS}
    if suffix.endswith("/embeddings"):
        return {"model": "m", "input": TOKENS}
    if "chat" in suffix or "messages" in suffix or "responses" in suffix:
        return {"model": "m", "messages": CHAT, "max_tokens": 4}
    return {"model": "m", "prompt": TOKENS}


def _cases() -> list[tuple[str, dict[str, str], bytes]]:
    cases = []
    for route in ROUTES:
        path = route.suffix if route.suffix.startswith(("/inference", "/v1")) else "/v1" + route.suffix
        cases.append((path, {}, orjson.dumps(_body_for(route.suffix))))
    text = orjson.dumps({"model": "m", "prompt": "the same text prompt " * 30})
    cases += [
        ("/v1/completions", {}, text),
        ("/v1/completions?stream=1", {}, orjson.dumps({"model": "m", "prompt": [TOKENS, TOKENS[:50]]})),
        ("/v1/completions", {"x-llm-d-model-name-rewrite": "m-served"}, orjson.dumps({"model": "m", "prompt": TOKENS})),
        ("/v1/completions", {"x-gateway-model-name-rewrite": "m-served"}, orjson.dumps({"model": "m", "prompt": TOKENS})),
        ("/v1/chat/completions", {"x-gateway-model-name-rewrite": "m-served"}, orjson.dumps({"model": "m", "messages": CHAT})),
        ("/v1/chat/completions", {"x-llm-d-model-name-rewrite": "m-served", "x-gateway-model-name-rewrite": "other"},
         orjson.dumps({"model": "m", "messages": CHAT})),
        ("/v1/completions", {}, b'{"prompt": [1, 2]}'),  # no model: 400 on both
        ("/v1/completions", {}, b'{"model": "m", "prompt": [1, -2]}'),
    ]
    return cases


def _debug_score(admin_port: int, path: str, extra: dict[str, str], data: bytes) -> tuple[int, dict[str, object]]:
    url = f"http://127.0.0.1:{admin_port}/debug/score?path=" + urllib.parse.quote(path, safe="")
    request = urllib.request.Request(url, data=data, method="POST", headers=extra)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def _ext_proc(client: Client, path: str, extra: dict[str, str], data: bytes, request_id: str) -> tuple[int, str]:
    """(status, destination) of one request through the stream, its response completed."""
    replies = client.run([
        headers(path, extra={**extra, "x-request-id": request_id}, mode=BUFFERED), body(data),
        response_headers(200), response_body(b"{}", eos=True),
    ])
    for reply in replies:
        if reply.WhichOneof("response") == "immediate_response":
            return reply.immediate_response.status.code, ""
        if reply.WhichOneof("response") == "request_body" and reply.HasField("dynamic_metadata"):
            return 200, metadata_destination(reply)
    raise AssertionError(f"no routing reply: {replies}")


def test_stream_and_debug_score_assemble_the_same_request(tmp_path: Path) -> None:
    tokenizer = tmp_path / "tokenizer"
    build_tiny_tokenizer(tokenizer)
    with running_service(tmp_path, CONFIG.format(tokenizer=tokenizer), endpoints=PODS) as svc:
        client = Client(svc.grpc_port)
        try:
            decisions_url = f"http://127.0.0.1:{svc.admin_port}/debug/decisions?request_id="
            routed = refused = unique = 0
            for i, (path, extra, data) in enumerate(_cases()):
                # A first pass seeds one endpoint speculatively with this prompt, so the second
                # has a unique best endpoint whenever the request carries (or yields) tokens.
                _ext_proc(client, path, extra, data, f"warm-{i}")
                status, answer = _debug_score(svc.admin_port, path, extra, data)
                ext_status, destination = _ext_proc(client, path, extra, data, f"case-{i}")
                assert ext_status == status, (path, extra, answer)
                if status != 200:
                    refused += 1
                    continue
                routed += 1
                endpoints = answer["endpoints"]
                assert isinstance(endpoints, list)
                best = max(e["total"] for e in endpoints)
                top = {e["endpoint"] for e in endpoints if e["total"] == best}
                assert destination in top, (path, extra, answer, destination)
                if len(top) == 1:
                    unique += 1
                    assert destination == answer["picked"], (path, extra)
                with urllib.request.urlopen(decisions_url + f"case-{i}", timeout=10) as response:
                    (decision,) = json.loads(response.read())["decisions"]
                assert decision["promptTokens"] == answer["promptTokens"], (path, extra)
                assert decision["tokenizeOutcome"] == answer["tokenizeOutcome"], (path, extra)
        finally:
            client.close()
    # anthropic and sglang paths (no parser configured for them) and the two bad bodies
    assert refused >= 6
    assert routed >= 12 and unique >= 8
