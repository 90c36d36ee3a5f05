"""Routes the peer routers call on a worker beyond inference: ``POST /tokenize``.

``vllm-router`` (0.1.17) asks every worker, before each text request, for
``POST /v1/completions/render`` and, when that fails, ``POST /tokenize`` (observed at the mock's
door; both are vLLM routes, ``vllm/entrypoints/serve/tokenize``). A real vLLM answers
``/tokenize`` always, so the mock does too, with the tokenisation it serves by: a string prompt
is its UTF-8 bytes. The chat form (``messages``) needs a chat template, which this module does
not have: it answers 400 like vLLM does for a request it cannot render.

``sglang-router`` (0.3.2) probes ``/server_info``, ``/get_server_info``, ``/model_info`` and
``/get_model_info`` at registration (SGLang-server routes) and carries on after a 404, which is
what a real vLLM answers; the mock answers the same on purpose (a served ``model_path`` would make
the router try to load a tokenizer by that name).
"""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

import ppc_extproc_lab.mock_vllm.protocol as p
from ppc_extproc_lab.mock_vllm.engine import MockEngine, RequestRejected

__all__ = ["add_peer_probe_routes", "tokenize_body"]


def tokenize_body(body: object, engine: MockEngine) -> dict[str, Any]:
    """vLLM's ``TokenizeResponse`` for a completion-form ``/tokenize`` body; raises
    :class:`RequestRejected` (400) or :class:`~ppc_extproc_lab.mock_vllm.protocol.NotFound` (404)."""
    if not isinstance(body, dict):
        raise RequestRejected("The request body must be a JSON object.")
    model = body.get("model")
    if model is not None and model != engine.config.model:
        raise p.NotFound(f"The model `{model}` does not exist.")
    if "messages" in body:
        raise RequestRejected("Chat tokenization is not supported by this mock engine.")
    prompt = body.get("prompt")
    if not isinstance(prompt, str):
        raise RequestRejected("prompt must be a string.")
    tokens = p.parse_prompt(prompt)[0] if prompt else []
    strs = [p.token_text((t,)) for t in tokens] if body.get("return_token_strs") else None
    return {
        "count": len(tokens),
        "max_model_len": engine.config.num_blocks * engine.config.block_size,
        "tokens": tokens,
        "token_strs": strs,
    }


def add_peer_probe_routes(app: web.Application, engine: MockEngine) -> None:
    """Register ``POST /tokenize`` for ``engine`` on ``app``."""

    async def tokenize(request: web.Request) -> web.Response:
        try:
            try:
                body = orjson.loads(await request.read())
            except orjson.JSONDecodeError as e:
                raise RequestRejected(f"Invalid JSON body: {e}") from None
            answer = tokenize_body(body, engine)
        except p.NotFound as e:
            return _json(p.error_body(str(e), 404, "NotFoundError"), 404)
        except RequestRejected as e:
            return _json(p.error_body(str(e)), 400)
        return _json(answer)

    app.router.add_post("/tokenize", tokenize)


def _json(body: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json")
