"""Text routes of the mock engine, tokenized with a real HF tokenizer (``mock-vllm --tokenizer DIR``).

The same :class:`~ppc_extproc.tokenizer.LocalTokenizer` the router uses turns bodies into ids, so
the mock's prefix cache, KV events and ``cached_tokens`` follow the router's view exactly.

vLLM 0.32 shapes (``vllm/entrypoints/scale_out/render/serving.py``, ``…/serve/tokenize/``,
``…/openai/chat_completion/protocol.py``, ``…/anthropic/serving.py``):

* ``POST /tokenize`` → ``{"count", "max_model_len", "tokens", "token_strs"}``;
* ``POST /v1/completions/render`` → a list of ``GenerateRequest`` (``cmpl-<id>`` or ``cmpl-<id>-<i>``);
* ``POST /v1/chat/completions/render`` → one ``GenerateRequest`` (``chatcmpl-<id>``);
* ``POST /v1/chat/completions`` (streaming or not) and ``POST /v1/messages`` (not streaming) run
  the engine and report ``usage.prompt_tokens_details.cached_tokens`` /
  ``usage.cache_read_input_tokens``.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import numpy as np
import orjson
from aiohttp import web

import ppc_extproc_lab.mock_vllm.protocol as p
from ppc_extproc.errors import BadRequestError
from ppc_extproc.tokenizer.local import LocalTokenizer
from ppc_extproc.tokenizer.requests import parse_chat
from ppc_extproc.tokenizer.result import TokenizeResult
from ppc_extproc_lab.mock_vllm.engine import EngineAborted, EngineRequest, MockEngine, RequestRejected
from ppc_extproc_lab.mock_vllm.kv_transfer import KV_SIDE, KvTransfer, record_request, response_params
from ppc_extproc_lab.mock_vllm.streaming import ENGINE, TOKENIZER, sse_stream

__all__ = ["add_text_routes", "chat_ids", "generate_request"]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _ids(b: bytes) -> list[int]:
    return np.frombuffer(b, dtype="<u4").tolist()  # type: ignore[no-any-return]


def _max_model_len(engine: MockEngine) -> int:
    return engine.config.num_blocks * engine.config.block_size


def _sampling_params(body: Mapping[str, Any], n_prompt: int, max_model_len: int) -> dict[str, Any]:
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool):
        max_tokens = max_model_len - n_prompt
    max_tokens = min(max_tokens, max_model_len - n_prompt)
    return {
        "presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0, "temperature": 1.0,
        "top_p": 1.0, "min_p": 0.0, "stop": [], "stop_token_ids": [], "max_tokens": max_tokens, "output_kind": 2,
        "skip_clone": True, "bad_words": [], "skip_reading_prefix_cache": False,
    }


def generate_request(request_id: str, token_ids: list[int], model: str, body: Mapping[str, Any], max_model_len: int) -> dict[str, Any]:
    """vLLM's ``GenerateRequest`` as the render endpoints return it."""
    return {
        "request_id": request_id, "token_ids": token_ids, "token_offsets": None, "features": None,
        "content_parts": None, "sampling_params": _sampling_params(body, len(token_ids), max_model_len),
        "model": model, "reasoning_ended": None, "reasoning_parser_kwargs": None, "return_token_ids": None,
        "output_mode": "tokens", "stream": bool(body.get("stream") or False), "stream_options": body.get("stream_options"),
        "cache_salt": body.get("cache_salt"), "priority": 0, "kv_transfer_params": None, "ec_transfer_params": None,
    }


def _json(body: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json")


async def _body(request: web.Request) -> dict[str, Any]:
    try:
        obj = orjson.loads(await request.read())
    except orjson.JSONDecodeError as exc:
        raise BadRequestError(f"Invalid JSON body: {exc}") from None
    if not isinstance(obj, dict):
        raise BadRequestError("The request body must be a JSON object.")
    model = obj.get("model")
    served = request.app[ENGINE].config.model
    if model is not None and model != served:
        raise p.NotFound(f"The model `{model}` does not exist. Valid aliases: {served}.")
    return obj


def _errors(handler: Handler) -> Handler:
    async def wrapped(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except p.NotFound as exc:
            return _json({"error": {"message": str(exc), "type": "NotFoundError", "param": "model", "code": 404}}, 404)
        except (BadRequestError, RequestRejected) as exc:
            return _json(p.error_body(str(exc)), 400)
        except EngineAborted as exc:
            return _json(p.error_body(str(exc), 500, "InternalServerError"), 500)

    return wrapped


def _tokenized(res: TokenizeResult) -> list[int]:
    if not res.ok:
        raise BadRequestError(res.detail or f"the mock cannot tokenize this request: {res.reason}")
    return _ids(res.prompts[0])


def chat_ids(tok: LocalTokenizer, body: Mapping[str, Any]) -> list[int]:
    """The ids ``/v1/chat/completions`` computes for ``body`` (what ``/mock/match`` asks about)."""
    return _tokenized(tok.tokenize_chat(parse_chat(body)))


async def tokenize(request: web.Request) -> web.StreamResponse:
    tok, engine = request.app[TOKENIZER], request.app[ENGINE]
    body = await _body(request)
    if "messages" in body:
        ids = _tokenized(tok.tokenize("chat", body))
    else:
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise BadRequestError("prompt: expected a string")
        ids = _tokenized(tok.tokenize("completions", {"prompt": prompt, "add_special_tokens": body.get("add_special_tokens", True)}))
    strs = [tok.tokenizer.backend.id_to_token(i) for i in ids] if body.get("return_token_strs") else None
    return _json({"count": len(ids), "max_model_len": _max_model_len(engine), "tokens": ids, "token_strs": strs})


async def completions_render(request: web.Request) -> web.StreamResponse:
    tok, engine = request.app[TOKENIZER], request.app[ENGINE]
    body = await _body(request)
    res = tok.tokenize("completions", body)
    rid = f"cmpl-{uuid.uuid4().hex[:16]}"
    many = len(res.prompts) > 1
    return _json(
        [
            generate_request(f"{rid}-{i}" if many else rid, _ids(ids), engine.config.model, body, _max_model_len(engine))
            for i, ids in enumerate(res.prompts)
        ]
    )


async def chat_render(request: web.Request) -> web.StreamResponse:
    tok, engine = request.app[TOKENIZER], request.app[ENGINE]
    body = await _body(request)
    ids = _tokenized(tok.tokenize("chat", body))
    return _json(generate_request(f"chatcmpl-{uuid.uuid4().hex[:16]}", ids, engine.config.model, body, _max_model_len(engine)))


def _submit(
    engine: MockEngine, ids: list[int], body: Mapping[str, Any], salt: str | None, kv: KvTransfer | None = None
) -> EngineRequest:
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or 16
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise BadRequestError(f"max_tokens must be at least 1, got {max_tokens!r}.")
    MockEngine.validate(ids, max_tokens)
    return engine.submit(ids, max_tokens, salt, None, kv)


async def _wait(engine: MockEngine, req: EngineRequest) -> None:
    try:
        await req.done
    except BaseException:
        engine.abort(req, "client disconnected")
        raise


async def chat_completions(request: web.Request) -> web.StreamResponse:
    tok, engine = request.app[TOKENIZER], request.app[ENGINE]
    body = await _body(request)
    kv = record_request(request, body)
    chat = parse_chat(body)
    ids = _tokenized(tok.tokenize_chat(chat))
    stream = bool(body.get("stream") or False)
    options = body.get("stream_options")
    include_usage = stream and isinstance(options, dict) and bool(options.get("include_usage"))
    req = _submit(engine, ids, body, chat.cache_salt, kv)
    cid, created, model = f"chatcmpl-{uuid.uuid4().hex}", p.now_created(), engine.config.model
    if not stream:
        await _wait(engine, req)
        message: dict[str, Any] = {"role": "assistant", "content": p.token_text(req.output), "refusal": None, "annotations": None,
                   "audio": None, "function_call": None, "tool_calls": [], "reasoning": None}
        return _json({
            "id": cid, "object": "chat.completion", "created": created, "model": model,
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": "length", "stop_reason": None, "token_ids": None}],
            "service_tier": None, "system_fingerprint": None, "usage": p.usage([req]), "prompt_logprobs": None,
            "prompt_token_ids": None, "kv_transfer_params": response_params(request.app[KV_SIDE], req),
        })
    def chunk(_: int, pos: int) -> dict[str, Any]:
        delta: dict[str, Any] = {"content": p.token_text((req.output[pos - 1],))}
        if pos == 1:
            delta = {"role": "assistant", **delta}
        return {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
                "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": "length" if pos == req.max_tokens else None}]}

    def usage_chunk() -> dict[str, Any]:
        return {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model, "choices": [], "usage": p.usage([req])}

    return await sse_stream(request, [req], chunk, usage_chunk if include_usage else None)


async def messages(request: web.Request) -> web.StreamResponse:
    tok, engine = request.app[TOKENIZER], request.app[ENGINE]
    body = await _body(request)
    if body.get("stream"):
        raise BadRequestError("stream: the mock serves /v1/messages without streaming only")
    chat = parse_chat(tok.anthropic_chat_body(body), allow_empty_tools=True)
    ids = _tokenized(tok.tokenize_chat(chat))
    req = _submit(engine, ids, body, chat.cache_salt)
    await _wait(engine, req)
    cached = req.cached_tokens
    return _json({
        "id": f"msg_{uuid.uuid4().hex}", "type": "message", "role": "assistant",
        "content": [{"type": "text", "text": p.token_text(req.output)}], "model": engine.config.model,
        "stop_reason": "max_tokens", "stop_sequence": None,
        "usage": {"input_tokens": len(req.prompt) - cached, "output_tokens": req.max_tokens, "cache_read_input_tokens": cached},
    })


def add_text_routes(app: web.Application, tokenizer: LocalTokenizer) -> None:
    """Register the tokenizer-backed routes on a mock engine's app."""
    app[TOKENIZER] = tokenizer
    app.router.add_post("/tokenize", _errors(tokenize))
    app.router.add_post("/v1/completions/render", _errors(completions_render))
    app.router.add_post("/v1/chat/completions/render", _errors(chat_render))
    app.router.add_post("/v1/chat/completions", _errors(chat_completions))
    app.router.add_post("/v1/messages", _errors(messages))
