"""Admin HTTP server (default 127.0.0.1:9090 so nothing is exposed by default).

    GET  /metrics        Prometheus exposition
    GET  /healthz        200 while the process runs
    GET  /readyz         200 once configuration and the first endpoint list are loaded, else 503
    GET  /debug/decisions  the most recent routing decisions (``?request_id=`` filters)
    GET  /debug/state    endpoints, index size and entries per endpoint, KV-event sources and
                         counters, speculative entries, in-flight requests
    POST /debug/score    body: a request exactly as a client sends it (``?path=`` its API path,
                         default /v1/completions: chat and messages bodies are tokenized; the
                         ext_proc path's parser check and model-rewrite headers apply); answer: each
                         endpoint's match info, per-scorer scores and total, and the pick — with no
                         side effect (no speculative seeding, no in-flight count)
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any, Protocol

import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from ppc_extproc.errors import RequestError
from ppc_extproc.framework import PluginState
from ppc_extproc.scheduling.router import Router
from ppc_extproc.server.assembly import assemble_request

__all__ = ["MetricsAuth", "build_admin_app", "plugin_state_json"]


def plugin_state_json(state: PluginState) -> dict[str, Any]:
    """A plugin's state as ``/debug/state`` shows it."""
    out: dict[str, Any] = {"type": state.type_name}
    if state.index is not None:
        index = state.index
        out["index"] = {
            "requestKeys": index.request_keys, "engineKeys": index.engine_keys, "entries": index.entries,
            "evictedRequestKeys": index.evicted_request_keys, "evictedEngineKeys": index.evicted_engine_keys,
        }
        if state.entries_per_endpoint is not None:
            out["index"]["entriesPerEndpoint"] = dict(state.entries_per_endpoint)
    if state.speculative_pending is not None:
        out["speculativePendingRequests"] = state.speculative_pending
    out.update(state.details)
    return out


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")


_AUTH_TEXT = {401: "Unauthorized", 403: "Forbidden"}


class MetricsAuth(Protocol):
    """Decides a ``/metrics`` request from its Authorization header (``MetricsAuthorizer``)."""

    async def check(self, authorization: str | None, path: str, method: str) -> int:
        """200 to serve, else the status to answer."""


def build_admin_app(
    router: Router,
    registry: CollectorRegistry,
    is_ready: Callable[[], bool],
    state: Callable[[], dict[str, Any]],
    decisions: Callable[[], list[dict[str, Any]]] = list,
    *,
    max_body_bytes: int = 16 * 1024 * 1024,
    debug: bool = True,
    metrics_auth: MetricsAuth | None = None,
) -> web.Application:
    async def metrics(request: web.Request) -> web.Response:
        if metrics_auth is not None:
            verdict = await metrics_auth.check(request.headers.get("Authorization"), request.path, request.method)
            if verdict != 200:
                return web.Response(status=verdict, text=_AUTH_TEXT.get(verdict, "Internal Server Error") + "\n")
        return web.Response(body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(_: web.Request) -> web.Response:
        return web.Response(text="ready\n") if is_ready() else web.Response(text="not ready\n", status=503)

    async def debug_state(_: web.Request) -> web.Response:
        return _json(state())

    async def debug_decisions(request: web.Request) -> web.Response:
        wanted = request.query.get("request_id")
        found = [d for d in decisions() if wanted is None or d.get("requestId") == wanted]
        return _json({"decisions": found})

    async def debug_score(request: web.Request) -> web.Response:
        body = await request.read()
        path = request.query.get("path", "/v1/completions")
        try:
            headers = {key.lower(): value for key, value in request.headers.items()}
            llm_request = assemble_request(router.pipeline, f"debug-{uuid.uuid4()}", path, headers, body).request
            decision = await router.route(llm_request, dry_run=True)
        except RequestError as error:
            return _json({"error": {"message": error.message, "code": error.status}}, status=error.status)
        result = decision.result.primary
        endpoints: list[dict[str, Any]] = []
        for endpoint in decision.ctx.candidates:
            info = decision.ctx.match_info(endpoint.id)
            endpoints.append({
                "endpoint": endpoint.id,
                "matchBlocks": info.match_blocks if info else 0,
                "totalBlocks": info.total_blocks if info else 0,
                "blockSizeTokens": info.block_size_tokens if info else 0,
                "cachedBlocksByTier": dict(info.cached_blocks_by_tier) if info else {},
                "scores": {name: scores.get(endpoint.id, 0.0) for name, scores in result.scores.items()},
                "total": result.totals.get(endpoint.id, 0.0),
            })
        endpoints.sort(key=lambda e: (-e["total"], e["endpoint"]))
        return _json({
            "endpoints": endpoints,
            "picked": decision.destination,
            "promptTokens": llm_request.prompt_tokens,
            "tokenizeOutcome": llm_request.tokenize_outcome,
            **({"tokenizeDetail": llm_request.tokenize_detail} if llm_request.tokenize_detail else {}),
        })

    # The ext_proc path's limit: a body the router would refuse with 413 is refused here too.
    app = web.Application(client_max_size=max_body_bytes)
    app.add_routes([web.get("/metrics", metrics), web.get("/healthz", healthz), web.get("/readyz", readyz)])
    if debug:  # off when the admin port listens beyond the pod (``serve --llm-d-defaults``)
        app.add_routes([
            web.get("/debug/state", debug_state),
            web.get("/debug/decisions", debug_decisions),
            web.post("/debug/score", debug_score),
        ])
    return app
