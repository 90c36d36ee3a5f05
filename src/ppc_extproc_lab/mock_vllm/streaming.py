"""What the mock's route modules share: the app keys and the SSE token stream.

:mod:`~ppc_extproc_lab.mock_vllm.http` (token routes) and :mod:`~ppc_extproc_lab.mock_vllm.text`
(text routes) both import this module, so neither imports the other's internals.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, Final

import orjson
from aiohttp import web

import ppc_extproc_lab.mock_vllm.protocol as p
from ppc_extproc.tokenizer.local import LocalTokenizer
from ppc_extproc_lab.mock_vllm.engine import EngineAborted, EngineRequest, MockEngine

__all__ = ["ENGINE", "STREAM_INTERVAL", "STREAM_MIN_INTERVAL_S", "TOKENIZER", "sse_stream"]

#: Minimum spacing of a stream's wake-ups (keeps CPU low with many concurrent streams).
STREAM_MIN_INTERVAL_S: Final = 0.02

#: The engine of an app.
ENGINE: Final = web.AppKey("engine", MockEngine)
#: The stream wake-up spacing of an app (``create_app(stream_interval_s=…)``).
STREAM_INTERVAL: Final = web.AppKey("stream_interval_s", float)
#: The tokenizer of an app started with ``--tokenizer`` (absent otherwise).
TOKENIZER: Final = web.AppKey("tokenizer", LocalTokenizer)


async def _tokens(
    reqs: Sequence[EngineRequest], min_interval_s: float = STREAM_MIN_INTERVAL_S
) -> AsyncIterator[list[tuple[int, int]]]:
    """Yield ``[(choice_index, token_pos)]`` batches as tokens fall due, in time order."""
    loop = asyncio.get_running_loop()
    emitted = [0] * len(reqs)
    last_wake = -math.inf
    while True:
        now = loop.time()
        due: list[tuple[float, int, int]] = []
        unstarted: list[asyncio.Future[None]] = []
        next_due = math.inf
        for i, r in enumerate(reqs):
            if emitted[i] >= r.max_tokens:
                continue
            if not r.first_token.done():
                unstarted.append(r.first_token)
                continue
            r.first_token.result()  # raises EngineAborted
            while emitted[i] < r.max_tokens and r.token_time(emitted[i] + 1) <= now:
                emitted[i] += 1
                due.append((r.token_time(emitted[i]), i, emitted[i]))
            if emitted[i] < r.max_tokens:
                next_due = min(next_due, r.token_time(emitted[i] + 1))
        if due:
            due.sort()
            yield [(i, pos) for _, i, pos in due]
        if all(emitted[i] >= r.max_tokens for i, r in enumerate(reqs)):
            return
        last_wake = now
        wake = max(next_due, last_wake + min_interval_s)
        timeout = None if math.isinf(wake) else max(wake - loop.time(), 0.0)
        if unstarted:
            await asyncio.wait(unstarted, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        else:
            await asyncio.sleep(timeout or 0.0)


async def sse_stream(
    request: web.Request,
    reqs: list[EngineRequest],
    chunk_for: Callable[[int, int], dict[str, Any]],
    usage_chunk: Callable[[], dict[str, Any]] | None,
) -> web.StreamResponse:
    """Stream token chunks, an optional usage chunk and ``[DONE]``; abort on disconnect."""
    engine = request.app[ENGINE]
    resp = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await resp.prepare(request)
    try:
        try:
            async for batch in _tokens(reqs, request.app.get(STREAM_INTERVAL, STREAM_MIN_INTERVAL_S)):
                await resp.write(
                    b"".join(
                        b"data: " + orjson.dumps(chunk_for(i, pos)) + b"\n\n" for i, pos in batch
                    )
                )
            await asyncio.gather(*(r.done for r in reqs))
            if usage_chunk is not None:
                await resp.write(b"data: " + orjson.dumps(usage_chunk()) + b"\n\n")
        except EngineAborted as e:
            await resp.write(
                b"data: " + orjson.dumps(p.error_body(str(e), 500, "InternalServerError")) + b"\n\n"
            )
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
    except (ConnectionResetError, asyncio.CancelledError):
        for r in reqs:
            engine.abort(r, "client disconnected")
        raise
    return resp
