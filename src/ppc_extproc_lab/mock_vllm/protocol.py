"""Request parsing and response shapes of vLLM's OpenAI server, for token prompts
(``vllm-project/vllm: vllm/entrypoints/openai/``).

Shapes follow vLLM's pydantic models field for field (``CompletionResponse``,
``CompletionStreamResponse``, ``GenerateResponse``, ``GenerateStreamResponse``, ``UsageInfo``,
``ErrorResponse``); ``usage.prompt_tokens_details`` is always ``{"cached_tokens": N}`` as with
``--enable-prompt-tokens-details``. Strings are "tokenised" as their UTF-8 bytes.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ppc_extproc_lab.mock_vllm.engine import EngineRequest, RequestRejected

__all__ = [
    "CompletionParams",
    "Encoder",
    "GenerateParams",
    "NotFound",
    "completion_chunk",
    "completion_response",
    "completion_stream_choice",
    "error_body",
    "generate_chunk",
    "generate_response",
    "now_created",
    "parse_completion",
    "parse_generate",
    "parse_prompt",
    "token_text",
    "usage",
]


class NotFound(RequestRejected):
    """The request names a model this engine does not serve (HTTP 404)."""


def error_body(
    message: str, status: int = 400, err_type: str = "BadRequestError"
) -> dict[str, Any]:
    """vLLM's ``ErrorResponse`` envelope."""
    return {"error": {"message": message, "type": err_type, "param": None, "code": status}}


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


#: Text → token ids (the ``--tokenizer``); without one, text is "tokenised" as its UTF-8 bytes.
Encoder = Callable[[str], list[int]]


def _utf8(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def parse_prompt(prompt: object, encode: Encoder | None = None) -> list[list[int]]:
    """``str | [str] | [int] | [[int]]`` → one token list per prompt (ids used verbatim)."""
    enc = encode or _utf8
    if isinstance(prompt, str):
        return [enc(prompt)]
    if isinstance(prompt, list) and prompt:
        if all(_is_int(t) for t in prompt):
            return [list(prompt)]
        if all(isinstance(p, str) for p in prompt):
            return [enc(p) for p in prompt]
        if all(isinstance(p, list) for p in prompt):
            if not all(all(_is_int(t) for t in p) for p in prompt):
                raise RequestRejected("Token prompts must contain only integers.")
            return [list(p) for p in prompt]
    raise RequestRejected(
        "prompt must be a string, a list of strings, a list of token ids "
        "or a list of lists of token ids."
    )


def _max_tokens(value: object) -> int:
    if value is None:
        return 16
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise RequestRejected(f"max_tokens must be at least 1, got {value!r}.")
    return value


def _cache_salt(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise RequestRejected("Parameter 'cache_salt' must be a non-empty string if provided.")
    return value


def _check_model(body: dict[str, Any], served: str) -> str:
    model = body.get("model")
    if model is not None and model != served:
        raise NotFound(f"The model `{model}` does not exist.")
    return served


def _include_usage(stream: bool, options: object) -> bool:
    if options is None:
        return False
    if not isinstance(options, dict):
        raise RequestRejected("stream_options must be an object.")
    if not stream:
        raise RequestRejected("Stream options can only be defined when `stream=True`.")
    return bool(options.get("include_usage"))


@dataclass(frozen=True, slots=True)
class CompletionParams:
    """The fields of ``POST /v1/completions`` the mock honours."""

    model: str
    prompts: list[list[int]]
    max_tokens: int
    stream: bool
    include_usage: bool
    cache_salt: str | None
    return_token_ids: bool


@dataclass(frozen=True, slots=True)
class GenerateParams:
    """The fields of ``POST /inference/v1/generate`` the mock honours."""

    model: str
    request_id: str
    token_ids: list[int]
    max_tokens: int
    stream: bool
    include_usage: bool
    cache_salt: str | None


def parse_completion(body: object, served_model: str, encode: Encoder | None = None) -> CompletionParams:
    """Validate a completions body; raises :class:`RequestRejected` / :class:`NotFound`."""
    if not isinstance(body, dict):
        raise RequestRejected("The request body must be a JSON object.")
    model = _check_model(body, served_model)
    if "prompt" not in body:
        raise RequestRejected("Field required: prompt")
    stream = bool(body.get("stream") or False)
    return CompletionParams(
        model=model,
        prompts=parse_prompt(body["prompt"], encode),
        max_tokens=_max_tokens(body.get("max_tokens")),
        stream=stream,
        include_usage=_include_usage(stream, body.get("stream_options")),
        cache_salt=_cache_salt(body.get("cache_salt")),
        return_token_ids=bool(body.get("return_token_ids") or False),
    )


def parse_generate(body: object, served_model: str) -> GenerateParams:
    """Validate a tokens-in/tokens-out body (vLLM's ``GenerateRequest``)."""
    if not isinstance(body, dict):
        raise RequestRejected("The request body must be a JSON object.")
    model = _check_model(body, served_model)
    token_ids = body.get("token_ids")
    if not isinstance(token_ids, list) or not all(_is_int(t) for t in token_ids):
        raise RequestRejected("token_ids must be a list of integers.")
    sampling = body.get("sampling_params") or {}
    if not isinstance(sampling, dict):
        raise RequestRejected("sampling_params must be an object.")
    stream = bool(body.get("stream") or False)
    rid = body.get("request_id")
    return GenerateParams(
        model=model,
        request_id=str(rid) if rid else uuid.uuid4().hex,
        token_ids=list(token_ids),
        max_tokens=_max_tokens(sampling.get("max_tokens")),
        stream=stream,
        include_usage=_include_usage(stream, body.get("stream_options")),
        cache_salt=_cache_salt(body.get("cache_salt")),
    )


def token_text(tokens: Sequence[int]) -> str:
    """Trivial detokenisation: ids are bytes (ids ≥ 256 wrap), decoded leniently."""
    return bytes(t & 0xFF for t in tokens).decode("utf-8", errors="replace")


def usage(reqs: Sequence[EngineRequest], completion_tokens: int | None = None) -> dict[str, Any]:
    """``UsageInfo`` with ``prompt_tokens_details.cached_tokens`` summed over ``reqs``."""
    prompt = sum(len(r.prompt) for r in reqs)
    completion = sum(r.max_tokens for r in reqs) if completion_tokens is None else completion_tokens
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
        "prompt_tokens_details": {"cached_tokens": sum(r.cached_tokens for r in reqs)},
    }


def completion_response(
    cid: str, created: int, params: CompletionParams, reqs: Sequence[EngineRequest]
) -> dict[str, Any]:
    """Non-streaming ``CompletionResponse``."""
    choices = [
        {
            "index": i,
            "text": token_text(r.output),
            "logprobs": None,
            "finish_reason": "length",
            "stop_reason": None,
            "token_ids": r.output if params.return_token_ids else None,
            "prompt_logprobs": None,
            "prompt_token_ids": r.prompt if params.return_token_ids else None,
        }
        for i, r in enumerate(reqs)
    ]
    return {
        "id": cid,
        "object": "text_completion",
        "created": created,
        "model": params.model,
        "choices": choices,
        "service_tier": None,
        "system_fingerprint": None,
        "usage": usage(reqs),
        "kv_transfer_params": None,
    }


def completion_chunk(
    cid: str,
    created: int,
    model: str,
    choices: list[dict[str, Any]],
    usage_info: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One ``CompletionStreamResponse`` (``choices=[]`` + usage for the final usage chunk)."""
    return {
        "id": cid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": choices,
        "usage": usage_info,
    }


def completion_stream_choice(
    index: int, req: EngineRequest, pos: int, return_token_ids: bool
) -> dict[str, Any]:
    """``CompletionResponseStreamChoice`` for output token ``pos`` (1-based) of ``req``."""
    tok = req.output[pos - 1]
    return {
        "index": index,
        "text": token_text((tok,)),
        "logprobs": None,
        "finish_reason": "length" if pos == req.max_tokens else None,
        "stop_reason": None,
        "prompt_token_ids": req.prompt if return_token_ids and pos == 1 else None,
        "token_ids": [tok] if return_token_ids else None,
    }


def generate_response(params: GenerateParams, created: int, req: EngineRequest) -> dict[str, Any]:
    """Non-streaming ``GenerateResponse``."""
    return {
        "request_id": f"generate-tokens-{params.request_id}",
        "model": params.model,
        "created": created,
        "choices": [
            {
                "index": 0,
                "logprobs": None,
                "finish_reason": "length",
                "token_ids": req.output,
                "routed_experts": None,
            }
        ],
        "usage": usage([req]),
        "prompt_logprobs": None,
        "kv_transfer_params": None,
    }


def generate_chunk(
    params: GenerateParams,
    req: EngineRequest | None,
    pos: int = 0,
    usage_info: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One ``GenerateStreamResponse``: token ``pos`` of ``req``, or the final usage chunk."""
    choices: list[dict[str, Any]] = []
    if req is not None:
        choices.append(
            {
                "index": 0,
                "logprobs": None,
                "finish_reason": "length" if pos == req.max_tokens else None,
                "token_ids": [req.output[pos - 1]],
                "routed_experts": None,
            }
        )
    return {
        "request_id": f"generate-tokens-{params.request_id}",
        "choices": choices,
        "usage": usage_info,
    }


def now_created() -> int:
    """``created`` timestamp (Unix seconds)."""
    return int(time.time())
