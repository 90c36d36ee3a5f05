"""The routing sidecar's leg bodies and cached-token rewrite, as llm-d's sidecar builds them
(``llm-d/llm-d-router: pkg/sidecar/proxy/connector_nixlv2.go``, ``connector_shared_storage.go``,
``cached_tokens_usage_rewriter.go``); no sockets."""

from __future__ import annotations

import orjson

from ppc_extproc_lab.pd_sidecar.legs import (
    ApiType,
    cached_tokens_of,
    nixl_decode_body,
    nixl_prefill_body,
    rewrite_cached_tokens_json,
    rewrite_cached_tokens_sse_line,
    shared_storage_decode_body,
    shared_storage_prefill_body,
)
from ppc_extproc_lab.pd_sidecar.proxy import prefill_candidates

KV = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
      "remote_block_ids": None, "remote_host": None, "remote_port": None}


def test_chat_prefill_leg_caps_every_limit_and_unstreams() -> None:
    body = {"messages": [], "max_tokens": 50, "stream": True, "stream_options": {"include_usage": True}}
    leg = nixl_prefill_body(body, ApiType.CHAT_COMPLETIONS)
    assert leg == {"messages": [], "max_tokens": 1, "max_completion_tokens": 1, "min_tokens": 1,
                   "stream": False, "kv_transfer_params": KV}
    assert body["max_tokens"] == 50 and body["stream"] is True  # the client's body is untouched


def test_responses_and_generate_limits() -> None:
    assert nixl_prefill_body({"input": "x"}, ApiType.RESPONSES)["max_output_tokens"] == 1
    assert "max_tokens" not in nixl_prefill_body({"input": "x"}, ApiType.RESPONSES)
    gen = nixl_prefill_body({"token_ids": [1]}, ApiType.GENERATE)
    assert gen["sampling_params"] == {"max_tokens": 1, "min_tokens": 1} and "max_tokens" not in gen
    kept = nixl_prefill_body({"token_ids": [1], "sampling_params": {"max_tokens": 9, "temperature": 0}}, ApiType.GENERATE)
    assert kept["sampling_params"] == {"max_tokens": 1, "min_tokens": 1, "temperature": 0}


def test_decode_leg_is_the_clients_body_with_the_prefillers_params() -> None:
    returned = {"do_remote_prefill": True, "remote_block_ids": [1, 2]}
    body = {"prompt": [1], "max_tokens": 7, "stream": True}
    assert nixl_decode_body(body, returned) == {**body, "kv_transfer_params": returned}
    assert nixl_decode_body(body, None)["kv_transfer_params"] is None  # none returned: JSON null


def test_shared_storage_legs() -> None:
    body = {"prompt": "p", "max_tokens": 7, "stream": True}
    assert shared_storage_prefill_body(body) == {"prompt": "p", "max_tokens": 1, "max_completion_tokens": 1,
                                                 "cache_hit_threshold": 0, "stream": True}
    assert shared_storage_decode_body(body) == {**body, "cache_hit_threshold": 0}


def test_cached_tokens_read_and_rewritten() -> None:
    assert cached_tokens_of({"usage": {"prompt_tokens_details": {"cached_tokens": 32}}}) == 32
    assert cached_tokens_of({"usage": {"prompt_tokens_details": None}}) == 0
    assert cached_tokens_of([]) == 0
    raw = orjson.dumps({"usage": {"prompt_tokens": 9, "prompt_tokens_details": {"cached_tokens": 9}}})
    assert orjson.loads(rewrite_cached_tokens_json(raw, 4))["usage"]["prompt_tokens_details"] == {"cached_tokens": 4}
    created = orjson.loads(rewrite_cached_tokens_json(b'{"usage": {"prompt_tokens": 1}}', 0))
    assert created["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    assert rewrite_cached_tokens_json(b'{"choices": []}', 5) == b'{"choices": []}'
    assert rewrite_cached_tokens_json(b"not json", 5) == b"not json"
    line = b'data: {"usage": {"prompt_tokens_details": {"cached_tokens": 100}}}\r\n'
    assert rewrite_cached_tokens_sse_line(line, 16) == b'data: {"usage":{"prompt_tokens_details":{"cached_tokens":16}}}\r\n'
    assert rewrite_cached_tokens_sse_line(b"data: [DONE]\n", 1) == b"data: [DONE]\n"
    assert rewrite_cached_tokens_sse_line(b": comment\n", 1) == b": comment\n"


def test_prefill_candidates() -> None:
    assert prefill_candidates(["10.0.0.1:8000, 10.0.0.2:8000"]) == ["10.0.0.1:8000", "10.0.0.2:8000"]
    assert prefill_candidates(["a:1", "b:2"]) == ["a:1", "b:2"]
    assert prefill_candidates([]) == []
