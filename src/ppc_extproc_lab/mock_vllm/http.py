"""aiohttp application of one mock engine: vLLM's HTTP surface plus mock-only admin routes.

vLLM routes: ``POST /v1/completions``, ``POST /inference/v1/generate``, ``GET /v1/models``,
``GET /health``, ``GET /version``, ``GET /metrics``, ``GET /kv_event_sources``,
``POST /reset_prefix_cache``, ``POST /tokenize`` (UTF-8 bytes, :mod:`~ppc_extproc_lab.mock_vllm.peer_probes`;
with ``--tokenizer`` the text routes of :mod:`~ppc_extproc_lab.mock_vllm.text`). Mock routes:
``POST /mock/restart``, ``GET /mock/requests`` (the last inference requests received: path,
``x-request-id``, token limits, ``stream``, ``kv_transfer_params``), ``POST /mock/faults`` (``{"completions_status": 503, "metrics_status": 404,
"kv_events": false}``: answer completions / ``/metrics`` with that status, close the KV-event
publisher for good; ``null`` statuses clear), ``POST /mock/match`` (``{"prompt" | "messages", "cache_salt"?}`` →
``{"cached_tokens", "matched_tokens", "block_size"}``, no side effects; ``messages`` need
``--tokenizer``), ``GET /mock/state``, and the overload lab's ``GET /mock/scrapes`` and
``POST /mock/metrics-stall`` (:mod:`~ppc_extproc_lab.mock_vllm.scrapes`). Every response carries
``x-mock-vllm-endpoint``, a P/D leg's also ``x-mock-vllm-kv-transfer``
(:mod:`~ppc_extproc_lab.mock_vllm.kv_transfer`).

Streaming: one SSE ``data: <json>\\n\\n`` chunk per output token, each sent no earlier than the
token's simulated time; chunks due together are written together and the writer wakes at
most every :data:`STREAM_MIN_INTERVAL_S` (``create_app(stream_interval_s=…)``, ``--stream-interval-ms``),
so tokens may arrive in small bursts; with 0 every token is its own write, as vLLM sends them.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from typing import Any, Final

import numpy as np
import orjson
import structlog
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

import ppc_extproc_lab.mock_vllm.protocol as p
from ppc_extproc.errors import BadRequestError
from ppc_extproc.tokenizer.local import LocalTokenizer
from ppc_extproc_lab.mock_vllm.engine import EngineAborted, EngineRequest, MockEngine, RequestRejected
from ppc_extproc_lab.mock_vllm.kv_transfer import (
    DEFAULT_SIDE_CHANNEL_PORT,
    KV_SIDE,
    KV_TRANSFER_HEADER,
    REQUEST_LOG,
    KvSide,
    KvTransfer,
    RequestLog,
    leg_header,
    record_request,
    response_params,
)
from ppc_extproc_lab.mock_vllm.metrics import EngineCollector, engine_registry
from ppc_extproc_lab.mock_vllm.peer_probes import add_peer_probe_routes
from ppc_extproc_lab.mock_vllm.scrapes import SCRAPES, ScrapeLog, add_scrape_routes
from ppc_extproc_lab.mock_vllm.streaming import ENGINE, STREAM_INTERVAL, STREAM_MIN_INTERVAL_S, TOKENIZER, sse_stream
from ppc_extproc_lab.mock_vllm.text import add_text_routes, chat_ids

__all__ = ["ENDPOINT_HEADER", "create_app"]

logger = structlog.get_logger()

#: Response header naming the advertised ``ip:port`` of the engine that answered.
ENDPOINT_HEADER: Final = "x-mock-vllm-endpoint"
_INFO: Final = web.AppKey("info", dict)


def _json(body: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json")


def _error(message: str, status: int = 400, err_type: str = "BadRequestError") -> web.Response:
    return _json(p.error_body(message, status, err_type), status)


def _rejected(e: RequestRejected) -> web.Response:
    if isinstance(e, p.NotFound):
        return _error(str(e), 404, "NotFoundError")
    return _error(str(e))


def _encoder(request: web.Request, body: object) -> p.Encoder | None:
    """Text → ids with the app's tokenizer (``--tokenizer``); None keeps UTF-8 bytes as ids."""
    tok = request.app.get(TOKENIZER)
    if tok is None:
        return None
    special = body.get("add_special_tokens", True) if isinstance(body, dict) else True
    if not isinstance(special, bool):
        raise RequestRejected("add_special_tokens must be a boolean.")

    def encode(text: str) -> list[int]:
        return np.frombuffer(tok.encode(text, add_special_tokens=special), dtype="<u4").tolist()  # type: ignore[no-any-return]

    return encode


async def _read_json(request: web.Request) -> object:
    raw = await request.read()
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise RequestRejected(f"Invalid JSON body: {e}") from None


def _submit_all(
    engine: MockEngine,
    prompts: Sequence[list[int]],
    max_tokens: int,
    salt: str | None,
    request_id: str | None = None,
    kv: KvTransfer | None = None,
) -> list[EngineRequest]:
    for prompt in prompts:
        MockEngine.validate(prompt, max_tokens)
    reqs: list[EngineRequest] = []
    try:
        for i, prompt in enumerate(prompts):
            rid = (
                None
                if request_id is None
                else (request_id if len(prompts) == 1 else f"{request_id}-{i}")
            )
            reqs.append(engine.submit(prompt, max_tokens, salt, rid, kv))
    except RequestRejected:
        for r in reqs:
            engine.abort(r, "sibling prompt rejected")
        raise
    return reqs


async def _wait_done(engine: MockEngine, reqs: list[EngineRequest]) -> None:
    try:
        await asyncio.gather(*(r.done for r in reqs))
    except asyncio.CancelledError:
        for r in reqs:
            engine.abort(r, "client disconnected")
        raise


async def completions(request: web.Request) -> web.StreamResponse:
    engine = request.app[ENGINE]
    if status := request.app[_INFO]["faults"]["completions_status"]:
        await request.read()
        return _error("injected by POST /mock/faults", status, "ServiceUnavailableError")
    try:
        body = await _read_json(request)
        kv = record_request(request, body)
        params = p.parse_completion(body, engine.config.model, _encoder(request, body))
        reqs = _submit_all(engine, params.prompts, params.max_tokens, params.cache_salt, None, kv)
    except RequestRejected as e:
        return _rejected(e)
    cid, created = f"cmpl-{uuid.uuid4().hex}", p.now_created()
    if params.stream:

        def usage_chunk() -> dict[str, Any]:
            return p.completion_chunk(cid, created, params.model, [], p.usage(reqs))

        def chunk(i: int, pos: int) -> dict[str, Any]:
            choice = p.completion_stream_choice(i, reqs[i], pos, params.return_token_ids)
            return p.completion_chunk(cid, created, params.model, [choice])

        return await sse_stream(request, reqs, chunk, usage_chunk if params.include_usage else None)
    try:
        await _wait_done(engine, reqs)
    except EngineAborted as e:
        return _error(str(e), 500, "InternalServerError")
    out = p.completion_response(cid, created, params, reqs)
    out["kv_transfer_params"] = response_params(request.app[KV_SIDE], reqs[0])
    return _json(out)


async def generate(request: web.Request) -> web.StreamResponse:
    engine = request.app[ENGINE]
    try:
        body = await _read_json(request)
        kv = record_request(request, body)
        params = p.parse_generate(body, engine.config.model)
        reqs = _submit_all(
            engine, [params.token_ids], params.max_tokens, params.cache_salt, params.request_id, kv
        )
    except RequestRejected as e:
        return _rejected(e)
    created = p.now_created()
    if params.stream:

        def usage_chunk() -> dict[str, Any]:
            return p.generate_chunk(params, None, 0, p.usage(reqs))

        def chunk(i: int, pos: int) -> dict[str, Any]:
            return p.generate_chunk(params, reqs[i], pos)

        return await sse_stream(request, reqs, chunk, usage_chunk if params.include_usage else None)
    try:
        await _wait_done(engine, reqs)
    except EngineAborted as e:
        return _error(str(e), 500, "InternalServerError")
    out = p.generate_response(params, created, reqs[0])
    out["kv_transfer_params"] = response_params(request.app[KV_SIDE], reqs[0])
    return _json(out)


async def models(request: web.Request) -> web.Response:
    engine = request.app[ENGINE]
    cfg = engine.config
    created = p.now_created()
    card = {
        "id": cfg.model,
        "object": "model",
        "created": created,
        "owned_by": "vllm",
        "root": cfg.model,
        "parent": None,
        "max_model_len": cfg.num_blocks * cfg.block_size,
        "permission": [
            {
                "id": f"modelperm-{uuid.uuid4().hex}",
                "object": "model_permission",
                "created": created,
                "allow_create_engine": False,
                "allow_sampling": True,
                "allow_logprobs": True,
                "allow_search_indices": False,
                "allow_view": True,
                "allow_fine_tuning": False,
                "organization": "*",
                "group": None,
                "is_blocking": False,
            }
        ],
    }
    return _json({"object": "list", "data": [card]})


async def health(request: web.Request) -> web.Response:
    return web.Response(status=200)


async def version(request: web.Request) -> web.Response:
    return _json({"version": request.app[_INFO]["version"]})


async def metrics(request: web.Request) -> web.Response:
    info = request.app[_INFO]
    info["metrics_requests"] += 1
    log = request.app[SCRAPES]
    assert isinstance(log, ScrapeLog)
    if log.stalled and not await log.wait_unstalled():
        return web.Response(status=503, text="stalled by POST /mock/metrics-stall")
    if status := info["faults"]["metrics_status"]:
        return web.Response(status=status, text="injected by POST /mock/faults")
    body = generate_latest(info["registry"])
    log.record()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def kv_event_sources(request: web.Request) -> web.Response:
    return _json({"0": request.app[_INFO]["kv_events_config"]})


async def reset_prefix_cache(request: web.Request) -> web.Response:
    if request.app[ENGINE].reset_prefix_cache():
        return web.Response(status=200)
    return _error(
        "Failed to reset prefix cache: KV-cache blocks are in use by running requests.",
        409,
        "ConflictError",
    )


async def mock_restart(request: web.Request) -> web.Response:
    engine = request.app[ENGINE]
    engine.restart()
    return _json({"status": "restarted", "seq": engine.publisher.next_seq})


async def mock_faults(request: web.Request) -> web.Response:
    faults = request.app[_INFO]["faults"]
    try:
        body = await _read_json(request)
    except RequestRejected as e:
        return _rejected(e)
    if not isinstance(body, dict) or not set(body) <= {*faults, "kv_events"}:
        return _error(f"Body must be an object with keys among {sorted({*faults, 'kv_events'})}.")
    for key in ("completions_status", "metrics_status"):
        value = body.get(key, faults[key])
        if value is not None and not (isinstance(value, int) and 100 <= value <= 599):
            return _error(f"{key} must be an HTTP status or null.")
        faults[key] = value
    if body.get("kv_events") is False:
        await request.app[ENGINE].publisher.close()
    return _json(faults)


def _chat_ids(request: web.Request, body: dict[str, Any]) -> list[int]:
    tok = request.app.get(TOKENIZER)
    if tok is None:
        raise RequestRejected("`messages` need an engine started with --tokenizer.")
    try:
        return chat_ids(tok, body)
    except BadRequestError as e:
        raise RequestRejected(str(e)) from None


async def mock_match(request: web.Request) -> web.Response:
    engine = request.app[ENGINE]
    try:
        body = await _read_json(request)
        if not isinstance(body, dict) or ("prompt" not in body and "messages" not in body):
            raise RequestRejected("Body must be an object with `prompt` or `messages`.")
        if "messages" in body:  # a chat body, tokenized as /v1/chat/completions would
            prompts = [_chat_ids(request, body)]
        else:
            prompts = p.parse_prompt(body["prompt"], _encoder(request, body))
        if len(prompts) != 1:
            raise RequestRejected("`prompt` must be a single prompt.")
        salt = body.get("cache_salt")
        if salt is not None and not isinstance(salt, str):
            raise RequestRejected("cache_salt must be a string.")
        cached, matched = engine.match(MockEngine.validate(prompts[0], 1), salt)
    except RequestRejected as e:
        return _rejected(e)
    return _json(
        {"cached_tokens": cached, "matched_tokens": matched, "block_size": engine.config.block_size}
    )


async def mock_requests(request: web.Request) -> web.Response:
    return _json(request.app[REQUEST_LOG].entries())


async def mock_state(request: web.Request) -> web.Response:
    info = request.app[_INFO]
    state = request.app[ENGINE].state()
    state.update(
        endpoint=info["endpoint"],
        kv_events_endpoint=info["kv_events_config"].get("endpoint"),
        replay_endpoint=info["kv_events_config"].get("replay_endpoint"),
        event_encoding=info["event_encoding"],
        metrics_requests=info["metrics_requests"],
        kv_engine_id=request.app[KV_SIDE].engine_id,
    )
    return _json(state)


def create_app(
    engine: MockEngine,
    *,
    advertised_endpoint: str,
    vllm_version: str = "0.28.0",
    event_encoding: str = "map",
    kv_events_config: dict[str, Any] | None = None,
    engine_index: int = 0,
    tokenizer: LocalTokenizer | None = None,
    stream_interval_s: float = STREAM_MIN_INTERVAL_S,
    kv_engine_id: str | None = None,
    metrics_update_interval_s: float = 0.0,
) -> web.Application:
    """The aiohttp application serving ``engine`` as ``advertised_endpoint`` (``ip:port``);
    ``kv_engine_id`` names it in prefill legs' ``kv_transfer_params`` (default a uuid4, as vLLM);
    its gauges lag by up to ``metrics_update_interval_s`` (vLLM's per-step update)."""
    collector = EngineCollector(engine, engine_index, metrics_update_interval_s)
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app[ENGINE] = engine
    app[REQUEST_LOG] = RequestLog()
    app[KV_SIDE] = KvSide(
        kv_engine_id or str(uuid.uuid4()),
        advertised_endpoint.rpartition(":")[0].strip("[]"),
        DEFAULT_SIDE_CHANNEL_PORT + engine_index,
    )
    app[STREAM_INTERVAL] = stream_interval_s
    app[_INFO] = {
        "endpoint": advertised_endpoint,
        "version": vllm_version,
        "event_encoding": event_encoding,
        "kv_events_config": kv_events_config
        or {"enable_kv_cache_events": False, "publisher": "null"},
        "registry": engine_registry(engine, engine_index, collector),
        #: ``GET /metrics`` requests served (shown in ``/mock/state``: who polls this engine).
        "metrics_requests": 0,
        #: Injected by ``POST /mock/faults``.
        "faults": {"completions_status": None, "metrics_status": None},
    }

    async def add_header(request: web.BaseRequest, response: web.StreamResponse) -> None:
        response.headers[ENDPOINT_HEADER] = advertised_endpoint
        if (leg := leg_header(request)) is not None:
            response.headers[KV_TRANSFER_HEADER] = leg

    app.on_response_prepare.append(add_header)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/inference/v1/generate", generate)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_get("/version", version)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/kv_event_sources", kv_event_sources)
    app.router.add_post("/reset_prefix_cache", reset_prefix_cache)
    app.router.add_post("/mock/restart", mock_restart)
    app.router.add_post("/mock/faults", mock_faults)
    app.router.add_post("/mock/match", mock_match)
    app.router.add_get("/mock/state", mock_state)
    app.router.add_get("/mock/requests", mock_requests)
    add_scrape_routes(app, ScrapeLog(engine, collector))
    if tokenizer is not None:
        add_text_routes(app, tokenizer)  # /tokenize with the real tokenizer among them
    else:
        # What the peer routers probe beyond inference (routing benchmark); kept in its own module.
        add_peer_probe_routes(app, engine)
    return app
