"""``assemble_request``: the parser check, the rewrite headers' precedence, the forwarded body, and
the one parse whose object a token producer reads."""

from __future__ import annotations

import orjson
import pytest

from ppc_extproc.config.epp import load_config_text
from ppc_extproc.errors import BadRequestError
from ppc_extproc.server.assembly import assemble_request

CONFIG = """apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: precise-prefix-cache-producer
- type: prefix-cache-scorer
  parameters: {prefixMatchInfoProducerName: precise-prefix-cache-producer}
- type: openai-parser
requestHandler:
  parsers: [{pluginRef: openai-parser}]
"""
CHAT = orjson.dumps({"model": "client", "messages": [{"role": "user", "content": "hi"}]})


def test_a_path_no_configured_parser_claims_is_refused() -> None:
    pipeline = load_config_text(CONFIG).pipeline
    with pytest.raises(BadRequestError, match="no configured parser handles the request path /v1/messages"):
        assemble_request(pipeline, "r", "/v1/messages?x=1", {}, CHAT)


def test_rewrite_headers_llmd_first_and_the_forwarded_body_carries_the_target() -> None:
    pipeline = load_config_text(CONFIG).pipeline
    headers = {"x-gateway-model-name-rewrite": "gateway", "x-llm-d-model-name-rewrite": "llmd"}
    assembled = assemble_request(pipeline, "r", "/v1/chat/completions", headers, CHAT)
    assert (assembled.request.model, assembled.body_model, assembled.rewritten) == ("llmd", "client", True)
    assert orjson.loads(assembled.request.body)["model"] == "llmd"
    # the token producer reads this object instead of parsing the body again
    assert assembled.request.body_json == orjson.loads(assembled.request.body)

    only_gateway = assemble_request(pipeline, "r", "/v1/chat/completions", {"x-gateway-model-name-rewrite": "gw"}, CHAT)
    assert only_gateway.request.model == "gw"


def test_a_token_id_body_is_forwarded_untouched_and_keeps_no_object() -> None:
    pipeline = load_config_text(CONFIG).pipeline
    body = orjson.dumps({"model": "m", "prompt": [1, 2, 3]})
    assembled = assemble_request(pipeline, "r", "/v1/completions", {}, body)
    assert assembled.request.body is body and not assembled.rewritten
    assert assembled.request.prompt_tokens == 3 and assembled.request.body_json is None
