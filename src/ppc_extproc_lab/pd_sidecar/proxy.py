"""A routing sidecar in front of one decode engine, speaking llm-d's P/D protocol
(``llm-d/llm-d-router: pkg/sidecar/proxy/chat_completions.go`` ``disaggregatedPrefillHandler``,
``connector_nixlv2.go``, ``connector_shared_storage.go``, ``proxy_helpers.go``, ``errors.go``).

* ``POST /v1/chat/completions``, ``/v1/completions``, ``/v1/messages``, ``/v1/responses`` and
  ``/inference/v1/generate`` read (and drop) ``x-prefiller-host-port``: several values, or one
  comma-separated value, name candidates; the first is used (``--enable-prefiller-sampling``:
  a random one). Without a prefiller the request goes to the decoder unchanged.
* With one, the connector's legs run (:mod:`~ppc_extproc_lab.pd_sidecar.legs`): nixlv2 sends the
  prefill leg (``x-request-id: <uuid>`` on both legs unless the client sent one), retries it only on 502/503/504 up to
  ``prefill_max_retries`` times (default 0) ``prefill_retry_backoff_s`` apart, then decodes with
  the prefiller's ``kv_transfer_params`` and rewrites the decode response's
  ``usage.prompt_tokens_details.cached_tokens`` (JSON or each SSE ``data:`` line) to the
  prefiller's. shared-storage prefills with one token and then decodes plainly.
* **A failed prefill is the client's answer** by default (``prefill_fallback="none"``, llm-d's
  behaviour): the prefiller's status, headers and body are returned as they are (an unreachable
  prefiller: 502 with an empty body, as Go's reverse proxy answers); upstream has no local-prefill
  fallback (llm-d/llm-d-router PR #1206 removed it), so the router is what avoids dead prefillers.
  ``prefill_fallback="local"`` (this lab's addition) instead decodes the client's own request on
  the local engine, which prefills it, when the prefill leg cannot connect, times out or answers
  5xx (after the retries); 4xx stays the client's answer. The response then carries
  ``x-prefill-fallback: <reason>``, which the router reads as evidence against the prefiller
  (it holds it down as it would on a relayed 502).
* A decoder that refuses connections: 503 with llm-d's "The decode node is not ready" body;
  any other decoder failure: 502 ``BadGateway``. ``GET /health`` is 200; other paths are proxied.
* Lab only: ``GET /sidecar/state`` (counters) and ``GET /sidecar/requests`` (the last
  :data:`REQUEST_LOG_SIZE` requests: the client's ``x-request-id``, the header's value, the
  prefiller used, the client's status, the local-prefill fallback's reason or None).

Bounds this lab adds (upstream has none): every upstream call has a connect timeout and a
per-read timeout, a prefill leg a total timeout (504 when exceeded), requests in flight are
capped (503 beyond), and bodies are limited to ``max_body_bytes``. The shared-storage
``cache_hit_threshold`` decode-first path and the SSRF allowlist are not implemented.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import aiohttp
import orjson
import structlog
from aiohttp import web
from multidict import CIMultiDict

from ppc_extproc.framework import PREFILL_FALLBACK_HEADER
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

__all__ = [
    "CONNECTORS",
    "PREFILL_FALLBACKS",
    "PREFILL_FALLBACK_HEADER",
    "PREFILL_HEADER",
    "SidecarOptions",
    "SidecarState",
    "create_sidecar_app",
]

log = structlog.get_logger(__name__)

#: ``llm-d/llm-d-router: pkg/common/routing/common.go`` ``PrefillEndpointHeader``.
PREFILL_HEADER: Final = "x-prefiller-host-port"
REQUEST_ID_HEADER: Final = "x-request-id"
CONNECTORS: Final = ("nixlv2", "shared-storage")
PREFILL_FALLBACKS: Final = ("none", "local")
REQUEST_LOG_SIZE: Final = 256

_ROUTES: Final = {
    "/v1/chat/completions": ApiType.CHAT_COMPLETIONS,
    "/v1/completions": ApiType.CHAT_COMPLETIONS,
    "/v1/messages": ApiType.CHAT_COMPLETIONS,
    "/v1/responses": ApiType.RESPONSES,
    "/inference/v1/generate": ApiType.GENERATE,
}
_HOP_BY_HOP: Final = frozenset(
    {"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade",
     "host", "content-length"}
)
_RETRYABLE: Final = frozenset({502, 503, 504})
#: ``llm-d/llm-d-router: pkg/sidecar/proxy/errors.go`` ``decoderServiceUnavailableResponseJSON``.
_DECODER_NOT_READY: Final = {
    "object": "error",
    "message": "The decode node is not ready. Please check that the vLLM service is running and the "
    "port configuration is correct.",
    "type": "ServiceUnavailable",
    "param": "",
    "code": 503,
}


@dataclass(frozen=True, slots=True)
class SidecarOptions:
    """Flags of ``python -m ppc_extproc_lab.pd_sidecar`` (upstream names in the comments)."""

    #: ``--decoder-url``: the local decode engine (upstream ``--model-server-port`` on localhost).
    decoder_url: str
    #: ``--kv-connector`` (upstream default ``nixlv2``).
    kv_connector: str = "nixlv2"
    #: ``--prefill-max-retries`` (upstream default 0) and ``--prefill-retry-backoff`` (200ms).
    prefill_max_retries: int = 0
    prefill_retry_backoff_s: float = 0.2
    #: ``--enable-prefiller-sampling``: pick a random candidate instead of the first.
    enable_prefiller_sampling: bool = False
    #: ``--prefill-fallback`` (lab only): ``none`` relays a failed prefill leg (llm-d), ``local``
    #: decodes the request on the local engine instead.
    prefill_fallback: str = "none"
    connect_timeout_s: float = 5.0
    #: Longest wait for any read from an upstream (prefill, decoder, stream chunk).
    read_timeout_s: float = 120.0
    #: Longest prefill leg, retries included.
    prefill_timeout_s: float = 120.0
    max_in_flight: int = 1024
    max_body_bytes: int = 64 * 1024 * 1024

    def __post_init__(self) -> None:
        if self.kv_connector not in CONNECTORS:
            raise ValueError(f"kv_connector must be one of {', '.join(CONNECTORS)}")
        if self.prefill_fallback not in PREFILL_FALLBACKS:
            raise ValueError(f"prefill_fallback must be one of {', '.join(PREFILL_FALLBACKS)}")
        if self.prefill_max_retries < 0 or self.max_in_flight < 1:
            raise ValueError("prefill_max_retries must be >= 0 and max_in_flight >= 1")


@dataclass(slots=True)
class SidecarState:
    """Counters (``GET /sidecar/state``)."""

    requests: int = 0
    disaggregated: int = 0
    prefill_errors: int = 0
    prefill_retries: int = 0
    #: Requests decoded locally after their prefill leg failed (``prefill_fallback="local"``).
    prefill_fallbacks: int = 0
    rejected_busy: int = 0


class _Upstream:
    """What one buffered leg got back; ``unreachable`` when no HTTP answer came at all."""

    def __init__(self, status: int, headers: Mapping[str, str], body: bytes, *, unreachable: bool = False) -> None:
        self.status, self.headers, self.body = status, headers, body
        self.unreachable = unreachable

    @property
    def fallback_reason(self) -> str | None:
        """Why local prefill may stand in for this prefill answer (None: it may not)."""
        if self.unreachable:
            return "unreachable"
        return f"status-{self.status}" if self.status >= 500 else None


def _forward_headers(
    headers: Mapping[str, str], request_id: str | None = None, *, json_body: bool = True
) -> CIMultiDict[str]:
    out: CIMultiDict[str] = CIMultiDict()
    for key, value in headers.items():
        if key.lower() not in _HOP_BY_HOP and key.lower() != PREFILL_HEADER:
            out.add(key, value)
    if request_id is not None and REQUEST_ID_HEADER not in out:
        # Upstream Header.Add()s the uuid after a client's x-request-id, which stays first: the one
        # vLLM reads. aiohttp's client cannot repeat a header, so only a missing one is added.
        out[REQUEST_ID_HEADER] = request_id
    if json_body:
        out["Content-Type"] = "application/json"
    return out


def _error(status: int, message: str, err_type: str) -> web.Response:
    """llm-d's sidecar error envelope (``errors.go`` ``sendError``)."""
    body = {"object": "error", "message": message, "type": err_type, "param": "", "code": status}
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json")


def prefill_candidates(values: list[str]) -> list[str]:
    """The prefiller candidates of the header's values (one value is split on commas)."""
    if len(values) == 1:
        values = values[0].split(",")
    return [v.strip() for v in values]


class _Sidecar:
    def __init__(self, options: SidecarOptions, session: aiohttp.ClientSession) -> None:
        self.options = options
        self.session = session
        self.state = SidecarState()
        self.decoder = options.decoder_url.rstrip("/")
        self._slots = asyncio.Semaphore(options.max_in_flight)
        self._rng = random.Random()
        self.log: deque[dict[str, Any]] = deque(maxlen=REQUEST_LOG_SIZE)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if self._slots.locked():
            self.state.rejected_busy += 1
            return _error(503, "sidecar: too many requests in flight", "ServiceUnavailable")
        async with self._slots:
            self.state.requests += 1
            api = _ROUTES.get(request.path)
            raw = await request.read()
            values = request.headers.getall(PREFILL_HEADER, [])
            candidates = prefill_candidates(values)
            prefiller = ""
            if candidates:
                idx = self._rng.randrange(len(candidates)) if self.options.enable_prefiller_sampling else 0
                prefiller = candidates[idx]
            entry: dict[str, Any] = {"x_request_id": request.headers.get(REQUEST_ID_HEADER), "path": request.path,
                                     "header": ",".join(values) if values else None, "prefiller": prefiller or None}
            self.log.append(entry)
            response = await self._route(request, raw, api, prefiller)
            entry["status"] = response.status
            entry["fallback"] = response.headers.get(PREFILL_FALLBACK_HEADER)
            return response

    async def _route(self, request: web.Request, raw: bytes, api: ApiType | None, prefiller: str) -> web.StreamResponse:
        if api is None or not prefiller:
            return await self._decode(request, raw, _forward_headers(request.headers, json_body=False))
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            return _error(400, f"invalid JSON: {exc}", "BadRequestError")
        if not isinstance(body, dict):
            return _error(400, "invalid JSON: the body must be an object", "BadRequestError")
        self.state.disaggregated += 1
        if self.options.kv_connector == "nixlv2":
            return await self._nixlv2(request, body, api, prefiller)
        return await self._shared_storage(request, body, prefiller)

    async def _nixlv2(
        self, request: web.Request, body: dict[str, Any], api: ApiType, prefiller: str
    ) -> web.StreamResponse:
        request_id = str(uuid.uuid4())
        pbody = orjson.dumps(nixl_prefill_body(body, api))
        headers = _forward_headers(request.headers, request_id)
        url = f"http://{prefiller.removeprefix('http://')}{request.path_qs}"
        try:
            async with asyncio.timeout(self.options.prefill_timeout_s):
                result = await self._prefill_with_retries(url, pbody, headers, prefiller, request_id)
        except TimeoutError:
            self.state.prefill_errors += 1
            log.warning("sidecar_prefill_timeout", prefiller=prefiller, request_id=request_id)
            if self._falls_back("timeout", request):
                return await self._decode_locally(request, body, "timeout")
            return _error(504, f"prefill at {prefiller} timed out", "GatewayTimeout")
        if not 200 <= result.status < 300:
            self.state.prefill_errors += 1
            log.warning("sidecar_prefill_failed", prefiller=prefiller, status=result.status, request_id=request_id)
            reason = result.fallback_reason
            if reason is not None and self._falls_back(reason, request):
                return await self._decode_locally(request, body, reason)
            return web.Response(status=result.status, body=result.body, headers=_response_headers(result.headers))
        try:
            presponse = orjson.loads(result.body)
        except orjson.JSONDecodeError as exc:
            return _error(400, f"invalid JSON from the prefiller: {exc}", "BadRequestError")
        kv_params = presponse.get("kv_transfer_params") if isinstance(presponse, dict) else None
        if kv_params is None:
            log.info("sidecar_prefill_without_kv_transfer_params", prefiller=prefiller, request_id=request_id)
        dbody = orjson.dumps(nixl_decode_body(body, kv_params))
        return await self._decode(
            request, dbody, _forward_headers(request.headers, request_id), cached_tokens=cached_tokens_of(presponse)
        )

    async def _prefill_with_retries(
        self, url: str, body: bytes, headers: CIMultiDict[str], prefiller: str, request_id: str
    ) -> _Upstream:
        attempt = 0
        while True:
            result = await self._send(url, body, headers)
            if 200 <= result.status < 300 or result.status not in _RETRYABLE:
                return result
            if attempt >= self.options.prefill_max_retries:
                return result
            attempt += 1
            self.state.prefill_retries += 1
            log.info("sidecar_prefill_retry", attempt=attempt, prefiller=prefiller, status=result.status,
                     request_id=request_id)
            await asyncio.sleep(self.options.prefill_retry_backoff_s)

    async def _send(self, url: str, body: bytes, headers: CIMultiDict[str]) -> _Upstream:
        """One buffered leg; a transport failure is Go's reverse-proxy answer, 502 without body."""
        try:
            async with self.session.post(url, data=body, headers=headers) as resp:
                return _Upstream(resp.status, resp.headers, await resp.read())
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.warning("sidecar_upstream_error", url=url, error=str(exc) or type(exc).__name__)
            return _Upstream(502, {}, b"", unreachable=True)

    def _falls_back(self, reason: str, request: web.Request) -> bool:
        """Whether a failed prefill leg is replaced by local prefill (and counted)."""
        if self.options.prefill_fallback != "local":
            return False
        self.state.prefill_fallbacks += 1
        log.info("sidecar_prefill_fallback", reason=reason, request_id=request.headers.get(REQUEST_ID_HEADER))
        return True

    async def _decode_locally(self, request: web.Request, body: dict[str, Any], reason: str) -> web.StreamResponse:
        """The client's own request to the local engine, which prefills it; the answer names why."""
        return await self._decode(request, orjson.dumps(body), _forward_headers(request.headers),
                                  extra_headers={PREFILL_FALLBACK_HEADER: reason})

    async def _shared_storage(self, request: web.Request, body: dict[str, Any], prefiller: str) -> web.StreamResponse:
        url = f"http://{prefiller.removeprefix('http://')}{request.path_qs}"
        headers = _forward_headers(request.headers)
        try:
            async with asyncio.timeout(self.options.prefill_timeout_s):
                result = await self._send(url, orjson.dumps(shared_storage_prefill_body(body)), headers)
        except TimeoutError:
            self.state.prefill_errors += 1
            if self._falls_back("timeout", request):
                return await self._decode_locally(request, body, "timeout")
            return _error(504, f"prefill at {prefiller} timed out", "GatewayTimeout")
        if not 200 <= result.status < 300:
            self.state.prefill_errors += 1
            log.warning("sidecar_prefill_failed", prefiller=prefiller, status=result.status)
            reason = result.fallback_reason
            if reason is not None and self._falls_back(reason, request):
                return await self._decode_locally(request, body, reason)
            return web.Response(status=result.status, body=result.body)
        return await self._decode(request, orjson.dumps(shared_storage_decode_body(body)), headers)

    async def _decode(
        self, request: web.Request, body: bytes, headers: CIMultiDict[str], *, cached_tokens: int | None = None,
        extra_headers: Mapping[str, str] | None = None,
    ) -> web.StreamResponse:
        """Proxy to the local decoder, streaming the answer through (rewriting ``cached_tokens``)."""
        url = f"{self.decoder}{request.path_qs}"
        try:
            upstream = await self.session.request(request.method, url, data=body, headers=headers)
        except aiohttp.ClientConnectorError as exc:
            log.warning("sidecar_decoder_unreachable", url=url, error=str(exc))
            if isinstance(exc.os_error, ConnectionRefusedError):
                return web.Response(status=503, body=orjson.dumps(_DECODER_NOT_READY), content_type="application/json")
            return _error(502, str(exc), "BadGateway")
        except (aiohttp.ClientError, TimeoutError) as exc:
            return _error(502, str(exc) or type(exc).__name__, "BadGateway")
        async with upstream:
            out = web.StreamResponse(status=upstream.status, headers=_response_headers(upstream.headers))
            if extra_headers:
                out.headers.update(extra_headers)
            sse = "text/event-stream" in upstream.headers.get("Content-Type", "")
            try:
                if cached_tokens is None or not sse:
                    if cached_tokens is not None:
                        data = rewrite_cached_tokens_json(await upstream.read(), cached_tokens)
                        out.content_length = len(data)
                        await out.prepare(request)
                        await out.write(data)
                    else:
                        await out.prepare(request)
                        async for chunk in upstream.content.iter_any():
                            await out.write(chunk)
                else:
                    await out.prepare(request)
                    async for line in upstream.content:  # lines, ending kept
                        await out.write(rewrite_cached_tokens_sse_line(line, cached_tokens))
            except (aiohttp.ClientError, TimeoutError) as exc:
                log.warning("sidecar_decode_stream_broken", url=url, error=str(exc) or type(exc).__name__)
                if not out.prepared:
                    return _error(502, str(exc) or type(exc).__name__, "BadGateway")
            await out.write_eof()
            return out


def _response_headers(headers: Mapping[str, str]) -> CIMultiDict[str]:
    out: CIMultiDict[str] = CIMultiDict()
    for key, value in headers.items():
        if key.lower() not in _HOP_BY_HOP and key.lower() != "content-encoding":
            out.add(key, value)
    return out


_SIDECAR: Final = web.AppKey("sidecar", _Sidecar)


async def _requests(request: web.Request) -> web.Response:
    return web.Response(body=orjson.dumps(list(request.app[_SIDECAR].log)), content_type="application/json")


async def _health(request: web.Request) -> web.Response:
    return web.Response(status=200)


async def _state(request: web.Request) -> web.Response:
    s = request.app[_SIDECAR].state
    body = {"requests": s.requests, "disaggregated": s.disaggregated, "prefill_errors": s.prefill_errors,
            "prefill_retries": s.prefill_retries, "prefill_fallbacks": s.prefill_fallbacks,
            "rejected_busy": s.rejected_busy}
    return web.Response(body=orjson.dumps(body), content_type="application/json")


def create_sidecar_app(options: SidecarOptions) -> web.Application:
    """The sidecar's aiohttp application; its client session opens on startup, closes on cleanup."""
    app = web.Application(client_max_size=options.max_body_bytes)

    async def session_ctx(app: web.Application) -> Any:
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=options.connect_timeout_s, sock_read=options.read_timeout_s
        )
        connector = aiohttp.TCPConnector(limit=options.max_in_flight * 2)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector, auto_decompress=False) as session:
            app[_SIDECAR] = _Sidecar(options, session)
            yield

    app.cleanup_ctx.append(session_ctx)

    async def dispatch(request: web.Request) -> web.StreamResponse:
        return await request.app[_SIDECAR].handle(request)

    app.router.add_get("/health", _health)
    app.router.add_get("/sidecar/state", _state)
    app.router.add_get("/sidecar/requests", _requests)
    app.router.add_route("*", "/{tail:.*}", dispatch)
    return app
