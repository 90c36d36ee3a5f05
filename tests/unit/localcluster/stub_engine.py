"""Stand-in for ``ppc-extproc mock-vllm``: an HTTP upstream that reports who served each request.

Accepts the flags ``LocalCluster`` passes to the mock engine (``--host --port --model
--kv-events-endpoint --replay-endpoint``; the ZMQ ones are ignored) and serves:

* ``GET /health`` → 200.
* ``POST /v1/completions`` → JSON ``{"served_by", "body_bytes", "headers"}`` with header
  ``x-mock-vllm-endpoint: host:port``; with ``"stream": true`` in the body, an SSE stream of
  ``--stream-events`` events ``--stream-interval`` seconds apart, then ``data: [DONE]``.

Not part of the shipped package.
"""

from __future__ import annotations

import argparse
import asyncio
import json

from aiohttp import web


def build_app(endpoint: str, events: int, interval: float) -> web.Application:
    """The aiohttp application; ``endpoint`` is ``host:port`` as reported to clients."""

    async def health(_request: web.Request) -> web.Response:
        return web.Response(text="ok", headers={"x-mock-vllm-endpoint": endpoint})

    async def completions(request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            body = {}
        headers = {"x-mock-vllm-endpoint": endpoint}
        if isinstance(body, dict) and body.get("stream"):
            resp = web.StreamResponse(headers={**headers, "content-type": "text/event-stream"})
            await resp.prepare(request)
            for i in range(events):
                await resp.write(
                    f"data: {json.dumps({'i': i, 'served_by': endpoint})}\n\n".encode()
                )
                await asyncio.sleep(interval)
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            return resp
        payload = {"served_by": endpoint, "body_bytes": len(raw), "headers": dict(request.headers)}
        return web.json_response(payload, headers=headers)

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_get("/health", health)
    app.router.add_post("/v1/completions", completions)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--stream-events", type=int, default=5)
    parser.add_argument("--stream-interval", type=float, default=0.2)
    args, _unknown = parser.parse_known_args()
    app = build_app(f"{args.host}:{args.port}", args.stream_events, args.stream_interval)
    web.run_app(app, host=args.host, port=args.port, print=None)


if __name__ == "__main__":
    main()
