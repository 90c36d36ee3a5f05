"""HTTP client of vLLM's render endpoints (llm-d's ``vllm`` token-producer backend).

``POST {url}/v1/completions/render`` and ``/v1/chat/completions/render`` receive the client's body
with only ``model`` replaced by the render server's ``modelName`` (llm-d
``pkg/epp/framework/plugins/requestcontrol/dataproducer/tokenizer/vllm_http.go``). The body is
re-encoded with orjson, which keeps every object's key order and every value — unlike llm-d's Go
map re-encode, which sorts keys and so changes the ids of templates that print tools with
``tojson``. Anthropic bodies go to ``/v1/messages/render`` (vLLM's own conversion); a server that
lacks the route (404 ``Not Found`` / 405) gets the converted chat body on the chat route from then on.

Bounded: an aiohttp HTTP/1.1 pool (``max_connections`` keep-alive sockets, 90 s idle), a cap on
concurrent calls (excess calls are refused, not queued), response bodies up to
``max_response_bytes``, the text/multimodal timeouts (the latter when any message content is a
non-empty array), no retries, and a :class:`~ppc_extproc.tokenizer.breaker.CircuitBreaker`.
Errors are returned as :class:`TokenizeResult` reasons and never cached.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import numpy as np
import orjson

from ppc_extproc.tokenizer.anthropic import anthropic_to_chat
from ppc_extproc.tokenizer.breaker import CircuitBreaker, Ticket
from ppc_extproc.tokenizer.requests import Api
from ppc_extproc.tokenizer.result import (
    BAD_RESPONSE,
    BREAKER_OPEN,
    TIMEOUT,
    TRANSPORT,
    UNSUPPORTED_BODY,
    TokenizeResult,
    http_reason,
)
from ppc_extproc.tokens.prompt import MultimodalFeature

__all__ = ["CONCURRENCY_LIMIT", "RenderClient", "RenderConfig", "splice_model"]

#: Reason when ``max_concurrency`` calls are already in flight.
CONCURRENCY_LIMIT = "concurrency_limit"
_PATHS = {"completions": "/v1/completions/render", "chat": "/v1/chat/completions/render", "messages": "/v1/messages/render"}
_GATEWAY_FAILURES = frozenset({502, 503, 504})
_ERROR_SNIPPET_BYTES = 1024
_UINT32_MAX = 0xFFFFFFFF


@dataclass(frozen=True, slots=True)
class RenderConfig:
    """Render backend settings (llm-d's ``vllm.*`` parameters plus ppc-extproc's bounds)."""

    #: Served model name of the render server; replaces the request's ``model``.
    model_name: str
    #: Base URL, ``http://`` or ``https://`` (``vllm.url``); trailing ``/`` ignored.
    url: str = "http://localhost:8000"
    #: Timeout of text-only requests (``vllm.timeout``).
    timeout_seconds: float = 5.0
    #: Timeout when any message content is a non-empty array (``vllm.mmTimeout``).
    mm_timeout_seconds: float = 30.0
    #: Keep-alive connections to the render host (llm-d: 16 idle per host).
    max_connections: int = 16
    #: Concurrent calls; more are refused with reason ``concurrency_limit``.
    max_concurrency: int = 256
    #: Unanswered this long, the oldest call becomes the breaker's probe (≤ the timeouts).
    stall_seconds: float = 1.0
    #: How long an open breaker refuses calls before one probe is let through.
    open_seconds: float = 5.0
    max_response_bytes: int = 64 * 1024 * 1024

    def __post_init__(self) -> None:
        if not self.model_name:
            raise ValueError("model_name must be set")
        if min(self.timeout_seconds, self.mm_timeout_seconds, self.stall_seconds) <= 0:
            raise ValueError("timeouts must be positive")
        if self.max_connections < 1 or self.max_concurrency < 1 or self.max_response_bytes < 1:
            raise ValueError("max_connections, max_concurrency and max_response_bytes must be >= 1")


def splice_model(obj: Mapping[str, Any], model: str) -> bytes:
    """``obj`` as JSON with ``model`` replaced in place (key order and values kept)."""
    out = dict(obj)
    if "model" in out:
        out["model"] = model
    else:
        out = {"model": model, **out}
    try:
        return orjson.dumps(out)
    except TypeError:  # integers beyond 64 bits: the stdlib keeps them exactly
        return json.dumps(out, ensure_ascii=False, separators=(",", ":")).encode()


def _uses_mm_timeout(obj: Mapping[str, Any]) -> bool:
    messages = obj.get("messages")
    if not isinstance(messages, list):
        return False
    return any(isinstance(m, dict) and isinstance(m.get("content"), list) and m["content"] for m in messages)


def _le32(ids: Any) -> bytes | None:
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i <= _UINT32_MAX for i in ids):
        return None
    return np.asarray(ids, dtype="<u4").tobytes()


def _features(raw: Any) -> tuple[MultimodalFeature, ...] | None:
    if raw is None:
        return ()
    if not isinstance(raw, dict):
        return None
    hashes, places = raw.get("mm_hashes") or {}, raw.get("mm_placeholders") or {}
    if not isinstance(hashes, dict) or not isinstance(places, dict):
        return None
    items = []
    for modality, hs in hashes.items():
        ps = places.get(modality) or []
        if not isinstance(hs, list) or not isinstance(ps, list):
            return None
        for h, span in zip(hs, ps):
            if not isinstance(h, str) or not isinstance(span, dict):
                return None
            off, length = span.get("offset"), span.get("length")
            if not isinstance(off, int) or not isinstance(length, int) or off < 0 or length < 0:
                return None
            items.append(MultimodalFeature(h, off, length))
    return tuple(sorted(items, key=lambda f: f.offset))


class RenderClient:
    """Async client of one render server. Use ``async with`` (or ``start``/``close``) on one loop."""

    def __init__(self, config: RenderConfig, *, session: aiohttp.ClientSession | None = None) -> None:
        self.config = config
        self._base = config.url.rstrip("/")
        #: A shared session (not closed here), or None: this client opens and closes its own.
        self._session: aiohttp.ClientSession | None = session
        self._owns_session = session is None
        self._slots = config.max_concurrency
        self.breaker = CircuitBreaker(stall_seconds=config.stall_seconds, open_seconds=config.open_seconds)
        #: False once the server answered the messages route with 404 Not Found / 405.
        self.messages_route = True

    async def start(self) -> None:
        if self._session is None:
            connector = aiohttp.TCPConnector(
                limit=self.config.max_connections, limit_per_host=self.config.max_connections, keepalive_timeout=90.0
            )
            self._session = aiohttp.ClientSession(connector=connector, headers={"Content-Type": "application/json"})

    async def close(self) -> None:
        if self._session is not None and self._owns_session:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> RenderClient:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- API ----------------------------------------------------------------------------------------

    async def render(
        self, api: Api, body: Mapping[str, Any], *, headers: Mapping[str, str] | None = None, model: str | None = None
    ) -> TokenizeResult:
        """Token ids of a parsed client body of ``api`` (what the engine will compute); ``model``
        replaces the configured ``model_name`` (an engine rendering the model it serves)."""
        salt = body.get("cache_salt") if isinstance(body.get("cache_salt"), str) else None
        if api == "completions":
            prompt = body.get("prompt")
            if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
                ids = _le32(prompt)
                if ids is not None:
                    return TokenizeResult((ids,), cache_salt=salt)
            return await self._call("completions", body, salt, headers, model)
        if api == "chat":
            return await self._call("chat", body, salt, headers, model)
        if api == "messages":
            if self.messages_route:
                res = await self._call("messages", body, salt, headers, model)
                if res.reason not in ("http_404", "http_405") or (res.reason == "http_404" and "Not Found" not in res.detail):
                    return res
                self.messages_route = False
            chat = anthropic_to_chat(body, merge_inline_system=False)
            return await self._call("chat", chat, salt, headers, model)
        return TokenizeResult.failed(UNSUPPORTED_BODY, f"{api} bodies are not rendered", salt)

    async def _call(
        self, api: Api, body: Mapping[str, Any], salt: str | None, headers: Mapping[str, str] | None, model: str | None
    ) -> TokenizeResult:
        timeout = self.config.mm_timeout_seconds if _uses_mm_timeout(body) else self.config.timeout_seconds
        payload = splice_model(body, model or self.config.model_name)
        ticket = self.breaker.admit()
        if ticket is None:
            return TokenizeResult.failed(BREAKER_OPEN, "render breaker open", salt)
        if self._slots <= 0:
            self.breaker.done(ticket)
            return TokenizeResult.failed(CONCURRENCY_LIMIT, "too many render calls in flight", salt)
        self._slots -= 1
        try:
            outcome = await self._exchange(ticket, _PATHS[api], payload, timeout, headers)
        finally:
            self._slots += 1
        if isinstance(outcome, TokenizeResult):
            return TokenizeResult.failed(outcome.reason or TRANSPORT, outcome.detail, salt)
        status, data = outcome
        if not 200 <= status < 300:
            return TokenizeResult.failed(http_reason(status), f"vLLM render returned status {status}: {data[:_ERROR_SNIPPET_BYTES].decode('utf-8', 'replace')}", salt)
        return self._parse(api, data, salt)

    async def _exchange(
        self, ticket: Ticket, path: str, payload: bytes, timeout: float, headers: Mapping[str, str] | None
    ) -> tuple[int, bytes] | TokenizeResult:
        """POST under the breaker: (status, body), or a failed result (timeout, transport, released)."""
        if self._session is None:
            await self.start()
        task = asyncio.ensure_future(self._post(path, payload, headers))
        released = asyncio.ensure_future(ticket.released.wait())
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            stall = min(self.config.stall_seconds, timeout)
            done, _ = await asyncio.wait({task, released}, timeout=stall, return_when=asyncio.FIRST_COMPLETED)
            if not done:
                self.breaker.stalled(ticket)
                remaining = max(deadline - loop.time(), 0.0)
                done, _ = await asyncio.wait({task, released}, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
            if task in done:
                try:
                    status, data = task.result()
                except (aiohttp.ClientError, OSError, ValueError) as exc:
                    self.breaker.failure(ticket)
                    return TokenizeResult.failed(TRANSPORT, f"post {path}: {exc!r}")
                if status in _GATEWAY_FAILURES:
                    self.breaker.failure(ticket)
                else:
                    self.breaker.success(ticket)
                return status, data
            if released in done:
                self.breaker.done(ticket)
                return TokenizeResult.failed(BREAKER_OPEN, "released: the render server stopped answering")
            self.breaker.failure(ticket)
            return TokenizeResult.failed(TIMEOUT, f"post {path}: no answer within {timeout:g}s")
        except asyncio.CancelledError:
            self.breaker.done(ticket)
            raise
        finally:
            for t in (task, released):
                if not t.done():
                    t.cancel()

    async def _post(self, path: str, payload: bytes, headers: Mapping[str, str] | None) -> tuple[int, bytes]:
        assert self._session is not None
        limit = self.config.max_response_bytes
        async with self._session.post(self._base + path, data=payload, headers=headers) as resp:
            if resp.content_length is not None and resp.content_length > limit:
                raise ValueError(f"render response larger than {limit} bytes")
            chunks: list[bytes] = []
            size = 0
            async for chunk in resp.content.iter_any():
                size += len(chunk)
                if size > limit:
                    raise ValueError(f"render response larger than {limit} bytes")
                chunks.append(chunk)
            return resp.status, b"".join(chunks)

    def _parse(self, api: Api, data: bytes, salt: str | None) -> TokenizeResult:
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            return TokenizeResult.failed(BAD_RESPONSE, f"unmarshal response: {exc}", salt)
        if api == "completions":
            if not isinstance(obj, list) or not obj:
                return TokenizeResult.failed(BAD_RESPONSE, "vLLM render returned empty response", salt)
            prompts = [_le32(o.get("token_ids")) if isinstance(o, dict) else None for o in obj]
            if any(p is None for p in prompts):
                return TokenizeResult.failed(BAD_RESPONSE, "token_ids: expected an array of uint32", salt)
            return TokenizeResult(tuple(p for p in prompts if p is not None), cache_salt=salt)
        if not isinstance(obj, dict):
            return TokenizeResult.failed(BAD_RESPONSE, "expected a GenerateRequest object", salt)
        ids = _le32(obj.get("token_ids"))
        features = _features(obj.get("features"))
        if ids is None or features is None:
            return TokenizeResult.failed(BAD_RESPONSE, "token_ids/features malformed", salt)
        return TokenizeResult((ids,), features=features, cache_salt=salt)
