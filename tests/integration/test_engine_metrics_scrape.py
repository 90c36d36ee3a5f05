"""metrics-data-source + core-metrics-extractor against real mock vLLM engines on free ports, plus a
hung and a dead endpoint: real polls, live load, staleness, and no delay for healthy engines."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import TypeVar

import aiohttp
import pytest
from aiohttp import web
from polled_metrics import Polled

from ppc_extproc.framework import Endpoint
from ppc_extproc.plugins.datalayer import PollOptions
from ppc_extproc.scheduling.pool import EndpointPool
from ppc_extproc_lab.mock_vllm.server import MockVllmOptions, start_fleet

pytestmark = pytest.mark.integration

T = TypeVar("T")
ENGINES = MockVllmOptions(
    port=0, kv_events_endpoint="", block_size=16, num_blocks=256, max_num_seqs=1, decode_ms_per_token=50.0
)
OPTIONS = PollOptions(interval_seconds=0.05, timeout_seconds=0.2)
STALE_AFTER_SECONDS = 0.3  # six polls


def run(factory: Callable[[], Awaitable[T]], timeout: float = 60.0) -> T:
    async def main() -> T:
        return await asyncio.wait_for(factory(), timeout)

    return asyncio.run(main())


async def until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met before the deadline"
        await asyncio.sleep(0.01)


def endpoint(ip_port: str) -> Endpoint:
    host, _, port = ip_port.rpartition(":")
    return Endpoint(host, int(port), name=ip_port)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.asynccontextmanager
async def hung_server(release: asyncio.Event):  # type: ignore[no-untyped-def]
    """/metrics accepts the connection and never answers (until released)."""

    async def metrics(_: web.Request) -> web.Response:
        await release.wait()
        return web.Response(text="vllm:num_requests_waiting 0\n")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield Endpoint("127.0.0.1", port)
    finally:
        release.set()
        await runner.cleanup()


def test_scrapes_mock_engines_and_isolates_slow_and_dead_ones() -> None:
    async def main() -> None:
        fleet = await start_fleet(replace(ENGINES, count=2))
        victim = await start_fleet(ENGINES)
        polled = Polled(OPTIONS, stale_after_seconds=STALE_AFTER_SECONDS)
        source = polled.source
        release = asyncio.Event()
        load: list[asyncio.Task[None]] = []
        try:
            async with hung_server(release) as hung, aiohttp.ClientSession() as http:
                good = [endpoint(e.endpoint) for e in fleet.engines]
                doomed = endpoint(victim.engines[0].endpoint)
                dead = Endpoint("127.0.0.1", free_port())
                pool = EndpointPool()
                pool.replace([*good, doomed, hung, dead])
                pool.subscribe(source.on_endpoint_event)
                await source.start()

                # real scrapes: vLLM's cache_config_info and gauges of each mock engine
                await until(lambda: all(polled.snapshot(e) is not None for e in [*good, doomed]))
                first = polled.snapshot(good[0])
                assert first is not None and (first.waiting, first.running, first.block_size, first.num_gpu_blocks) == (
                    0, 0, 16, 256,
                )

                # live load: max_num_seqs=1 and slow decode ⇒ one running, the rest waiting
                async def complete(i: int) -> None:
                    payload = {"model": "mock-model", "prompt": list(range(i * 100, i * 100 + 40)), "max_tokens": 40}
                    async with http.post(f"{fleet.engines[0].url}/v1/completions", json=payload) as r:
                        await r.read()

                load = [asyncio.create_task(complete(i)) for i in range(3)]
                await until(lambda: (m := polled.snapshot(good[0])) is not None and m.running == 1 and m.waiting == 2)
                assert polled.snapshot(good[0]).kv_usage > 0  # type: ignore[union-attr]

                # a hung and a dead endpoint fail on their own, without slowing the healthy ones
                await until(lambda: polled.target(hung)["consecutiveFailures"] >= 2)
                await until(lambda: polled.target(dead)["consecutiveFailures"] >= 2)
                assert polled.snapshot(hung) is None and polled.snapshot(dead) is None
                assert polled.target(hung)["lastError"] == "TimeoutError"
                before = polled.target(good[1])["polls"]
                await until(lambda: polled.target(good[1])["polls"] >= before + 10)

                # an engine that goes away is marked stale after the window, the others stay fresh
                await victim.stop()
                await until(lambda: polled.snapshot(doomed).stale)  # type: ignore[union-attr]
                assert not polled.snapshot(good[1]).stale  # type: ignore[union-attr]

                # deleted from the pool ⇒ forgotten
                pool.replace(good)
                assert polled.snapshot(doomed) is None and sorted(source.endpoints()) == sorted(e.id for e in good)
        finally:
            for task in load:
                task.cancel()
            await asyncio.gather(*load, return_exceptions=True)
            await source.stop()
            await victim.stop()
            await fleet.stop()

    run(main)

