"""Request parsing, vLLM's response shapes and the in-memory publisher."""

from __future__ import annotations

import asyncio
from typing import Any

import msgpack
import pytest

from ppc_extproc_lab.mock_vllm import protocol as p
from ppc_extproc_lab.mock_vllm.engine import EngineConfig, MockEngine, RequestRejected
from ppc_extproc_lab.mock_vllm.kv_events import AllBlocksCleared
from ppc_extproc_lab.mock_vllm.publisher import MemoryEventPublisher, default_topic


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [
        ([1, 2, 3], [[1, 2, 3]]),
        ([[1, 2], [3]], [[1, 2], [3]]),
        ("hi", [[104, 105]]),
        (["a", "é"], [[97], [0xC3, 0xA9]]),
    ],
)
def test_prompt_forms(prompt: Any, expected: list[list[int]]) -> None:
    assert p.parse_prompt(prompt) == expected


@pytest.mark.parametrize("prompt", [[], 5, [1, "a"], [[1], "a"], [[1, 2.5]], None, [True]])
def test_bad_prompts_are_rejected(prompt: Any) -> None:
    with pytest.raises(RequestRejected):
        p.parse_prompt(prompt)


def test_completion_params_defaults_and_validation() -> None:
    params = p.parse_completion({"prompt": [1, 2]}, "m")
    assert params.max_tokens == 16 and not params.stream and params.cache_salt is None
    assert params.model == "m"
    with pytest.raises(p.NotFound, match="does not exist"):
        p.parse_completion({"model": "other", "prompt": [1]}, "m")
    with pytest.raises(RequestRejected, match="cache_salt"):
        p.parse_completion({"prompt": [1], "cache_salt": ""}, "m")
    with pytest.raises(RequestRejected, match="max_tokens"):
        p.parse_completion({"prompt": [1], "max_tokens": 0}, "m")
    with pytest.raises(RequestRejected, match="stream=True"):
        p.parse_completion({"prompt": [1], "stream_options": {"include_usage": True}}, "m")
    assert p.parse_completion(
        {"prompt": [1], "stream": True, "stream_options": {"include_usage": True}}, "m"
    ).include_usage


def test_generate_params() -> None:
    params = p.parse_generate(
        {"token_ids": [1, 2], "sampling_params": {"max_tokens": 3}, "request_id": "abc"}, "m"
    )
    assert (params.token_ids, params.max_tokens, params.request_id) == ([1, 2], 3, "abc")
    with pytest.raises(RequestRejected, match="token_ids"):
        p.parse_generate({"token_ids": "12"}, "m")


def test_error_envelope() -> None:
    assert p.error_body("bad", 400) == {
        "error": {"message": "bad", "type": "BadRequestError", "param": None, "code": 400}
    }


def _finished_request(prompt: list[int], max_tokens: int) -> Any:
    async def scenario() -> Any:
        engine = MockEngine(EngineConfig(decode_ms_per_token=0.0))
        req = engine.submit(prompt, max_tokens)
        await req.done
        return req

    return asyncio.run(scenario())


def test_completion_response_shape_matches_8_3() -> None:
    req = _finished_request([1, 2, 3], 4)
    params = p.parse_completion({"prompt": [1, 2, 3], "max_tokens": 4}, "m")
    body = p.completion_response("cmpl-x", 7, params, [req])
    assert list(body) == [
        "id",
        "object",
        "created",
        "model",
        "choices",
        "service_tier",
        "system_fingerprint",
        "usage",
        "kv_transfer_params",
    ]
    assert body["object"] == "text_completion"
    (choice,) = body["choices"]
    assert list(choice) == [
        "index",
        "text",
        "logprobs",
        "finish_reason",
        "stop_reason",
        "token_ids",
        "prompt_logprobs",
        "prompt_token_ids",
    ]
    assert choice["finish_reason"] == "length" and choice["token_ids"] is None
    assert choice["text"] == bytes(req.output).decode()
    assert body["usage"] == {
        "prompt_tokens": 3,
        "total_tokens": 7,
        "completion_tokens": 4,
        "prompt_tokens_details": {"cached_tokens": 0},
    }


def test_return_token_ids_fills_both_id_lists() -> None:
    req = _finished_request([5, 6], 2)
    params = p.parse_completion({"prompt": [5, 6], "max_tokens": 2, "return_token_ids": True}, "m")
    (choice,) = p.completion_response("c", 0, params, [req])["choices"]
    assert choice["token_ids"] == req.output and choice["prompt_token_ids"] == [5, 6]


def test_generate_response_shape() -> None:
    req = _finished_request([1, 2], 3)
    params = p.parse_generate({"token_ids": [1, 2], "sampling_params": {"max_tokens": 3}}, "m")
    body = p.generate_response(params, 0, req)
    assert body["request_id"] == f"generate-tokens-{params.request_id}"
    assert body["choices"] == [
        {
            "index": 0,
            "logprobs": None,
            "finish_reason": "length",
            "token_ids": req.output,
            "routed_experts": None,
        }
    ]
    assert body["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}


def test_memory_publisher_numbers_buffers_and_restarts() -> None:
    pub = MemoryEventPublisher(topic=default_topic("10.0.0.5:8000", "m"), buffer_steps=2)
    assert pub.publish([]) is None
    seqs = [pub.publish([AllBlocksCleared()], ts=1.0) for _ in range(3)]
    assert seqs == [0, 1, 2]
    assert [int.from_bytes(f[1], "big") for f in pub.frames] == [0, 1, 2]
    assert pub.frames[0][0] == b"kv@10.0.0.5:8000@m"
    assert msgpack.unpackb(pub.frames[0][2], raw=False) == [1.0, [{"type": "AllBlocksCleared"}], 0]
    assert [s for s, _ in pub.retained(0)] == [1, 2]  # buffer keeps the last 2
    assert [s for s, _ in pub.retained(2)] == [2]
    pub.restart()
    assert pub.next_seq == 0 and pub.retained() == []
    assert pub.publish([AllBlocksCleared()]) == 0
