"""RenderClient against a controllable render server: verbatim bodies, error mapping, the breaker.

The server is a real aiohttp app on a run-time port that records raw request bytes and can
answer, fail with a status, or hang until released. No fixed sleeps: the tests wait on
conditions with deadlines.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import orjson
import pytest
from aiohttp import web

from ppc_extproc.tokenizer.breaker import BreakerState
from ppc_extproc.tokenizer.render_client import RenderClient, RenderConfig

pytestmark = pytest.mark.integration
T = TypeVar("T")


def run(factory: Callable[[], Awaitable[T]], timeout: float = 60) -> T:
    async def main() -> T:
        return await asyncio.wait_for(factory(), timeout)

    return asyncio.run(main())


@dataclass
class Server:
    url: str = ""
    bodies: list[bytes] = field(default_factory=list)
    status: int = 200
    hang: asyncio.Event | None = None  # set ⇒ handlers answer
    delay: float = 0.0
    features: Any = None

    async def handle(self, request: web.Request) -> web.Response:
        raw = await request.read()
        self.bodies.append(raw)
        if self.hang is not None:
            await self.hang.wait()
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.status != 200:
            return web.json_response({"error": {"message": "nope", "code": self.status}}, status=self.status)
        if request.path == "/v1/completions/render":
            return web.json_response([{"request_id": "cmpl-1", "token_ids": [1, 2, 3]}])
        return web.json_response({"request_id": "chatcmpl-1", "token_ids": [1, 5, 7], "features": self.features})


@asynccontextmanager
async def server() -> AsyncIterator[Server]:
    srv = Server()
    app = web.Application()
    app.router.add_post("/v1/completions/render", srv.handle)
    app.router.add_post("/v1/chat/completions/render", srv.handle)
    app.router.add_post("/v1/messages/render", srv.handle)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    srv.url = f"http://127.0.0.1:{port}"
    try:
        yield srv
    finally:
        if srv.hang is not None:
            srv.hang.set()
        await runner.cleanup()


async def wait_for(pred: Callable[[], Awaitable[bool]], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not await pred():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


CHAT = {"messages": [{"role": "user", "content": "hi"}]}


def test_body_is_forwarded_verbatim_with_model_spliced() -> None:
    async def scenario() -> None:
        async with server() as srv, RenderClient(RenderConfig(model_name="base-model", url=srv.url)) as client:
            body = {"stream": True, "model": "lora-a", "tools": [{"type": "function", "function": {"name": "f", "parameters": {"z": 1, "a": {"y": 2, "b": 3}}}}], "messages": [{"role": "user", "content": "Zürich 😀"}], "max_tokens": 7}
            res = await client.render("chat", body)
            assert res.ok and res.num_tokens() == 3
            sent = srv.bodies[-1]
            assert list(orjson.loads(sent)) == ["stream", "model", "tools", "messages", "max_tokens"]
            assert orjson.loads(sent) == {**body, "model": "base-model"}
            assert sent.index(b'"z"') < sent.index(b'"a"') < sent.index(b'"y"') < sent.index(b'"b"')
            await client.render("completions", {"prompt": "x"})
            assert list(orjson.loads(srv.bodies[-1])) == ["model", "prompt"]
            srv.features = {"mm_hashes": {"image": ["h2", "h1"]}, "mm_placeholders": {"image": [{"offset": 9, "length": 4}, {"offset": 2, "length": 3}]}}
            res = await client.render("chat", CHAT)
            assert [(f.hash, f.offset, f.length) for f in res.features] == [("h1", 2, 3), ("h2", 9, 4)]

    run(scenario)


@pytest.mark.parametrize("status", [400, 403, 404, 500])
def test_http_errors_are_reasons_and_do_not_open_the_breaker(status: int) -> None:
    async def scenario() -> None:
        async with server() as srv, RenderClient(RenderConfig(model_name="m", url=srv.url)) as client:
            srv.status = status
            res = await client.render("chat", {**CHAT, "cache_salt": "s"})
            assert res.reason == f"http_{status}" and res.cache_salt == "s" and "nope" in res.detail
            assert client.breaker.state is BreakerState.CLOSED
            srv.status = 200
            assert (await client.render("chat", CHAT)).ok  # errors are never cached

    run(scenario)


def test_mm_timeout_applies_to_array_content() -> None:
    mm = {"messages": [{"role": "user", "content": [{"type": "text", "text": "x"}]}]}

    def config(url: str) -> RenderConfig:
        return RenderConfig(model_name="m", url=url, timeout_seconds=0.2, mm_timeout_seconds=5.0, stall_seconds=5.0)

    async def scenario() -> None:
        async with server() as srv:
            srv.delay = 0.4  # between the two timeouts
            async with RenderClient(config(srv.url)) as client:
                t0 = time.monotonic()
                assert (await client.render("chat", CHAT)).reason == "timeout"
                assert time.monotonic() - t0 < 0.35
                assert (await client.render("chat", mm)).reason == "breaker_open"  # no second wait
            async with RenderClient(config(srv.url)) as client:
                assert (await client.render("chat", mm)).ok

    run(scenario)


async def _true(value: bool) -> bool:
    return value


def test_hanging_server_costs_one_timeout_then_recovers() -> None:
    timeout = 0.6

    async def scenario() -> None:
        async with server() as srv:
            cfg = RenderConfig(model_name="m", url=srv.url, timeout_seconds=timeout, stall_seconds=0.1, open_seconds=0.3)
            async with RenderClient(cfg) as client:
                assert (await client.render("chat", CHAT)).ok
                srv.hang = asyncio.Event()

                async def timed() -> tuple[float, str | None]:
                    t0 = time.monotonic()
                    res = await client.render("chat", CHAT)
                    return time.monotonic() - t0, res.reason

                results = await asyncio.gather(*(timed() for _ in range(16)))
                waited_full = [d for d, _ in results if d >= timeout * 0.9]
                assert len(waited_full) <= 1, results
                assert sorted(r for _, r in results).count("timeout") == 1
                assert all(r in ("timeout", "breaker_open") for _, r in results)
                sequential = [await timed() for _ in range(20)]
                assert all(r == "breaker_open" and d < 0.05 for d, r in sequential), sequential
                assert client.breaker.trips == 1
                # Still hanging when the breaker half-opens: one probe waits, everyone else is refused.
                await wait_for(lambda: _true(client.breaker.state is BreakerState.HALF_OPEN))
                probe = asyncio.ensure_future(timed())
                await wait_for(lambda: _true(client.breaker.state is not BreakerState.HALF_OPEN))
                others = await asyncio.gather(*(timed() for _ in range(5)))
                assert all(r == "breaker_open" and d < 0.05 for d, r in others)
                srv.hang.set()  # the server comes back: the probe is answered and closes the breaker
                _, r = await probe
                assert r is None
                assert client.breaker.state is BreakerState.CLOSED
                srv.hang = None
                for _ in range(3):
                    assert (await client.render("chat", CHAT)).ok

    run(scenario)


def test_dead_server_trips_on_the_first_transport_error() -> None:
    async def scenario() -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]  # closed when the block ends: nothing listens there
        cfg = RenderConfig(model_name="m", url=f"http://127.0.0.1:{port}", open_seconds=30)
        async with RenderClient(cfg) as client:
            first = await client.render("chat", CHAT)
            assert first.reason == "transport"
            rest = await asyncio.gather(*(client.render("chat", CHAT) for _ in range(10)))
            assert {r.reason for r in rest} == {"breaker_open"}

    run(scenario)


def test_gateway_errors_open_the_breaker_and_concurrency_is_capped() -> None:
    async def scenario() -> None:
        async with server() as srv:
            async with RenderClient(RenderConfig(model_name="m", url=srv.url, open_seconds=30)) as client:
                srv.status = 503
                assert (await client.render("chat", CHAT)).reason == "http_503"
                assert (await client.render("chat", CHAT)).reason == "breaker_open"
            srv.status, srv.hang, srv.bodies = 200, asyncio.Event(), []
            cfg = RenderConfig(model_name="m", url=srv.url, max_concurrency=2, stall_seconds=5)
            async with RenderClient(cfg) as client:
                inflight = [asyncio.ensure_future(client.render("chat", CHAT)) for _ in range(2)]
                await wait_for(lambda: _true(len(srv.bodies) == 2))
                assert (await client.render("chat", CHAT)).reason == "concurrency_limit"
                srv.hang.set()
                assert all(r.ok for r in await asyncio.gather(*inflight))

    run(scenario)


def test_messages_route_is_used_when_present() -> None:
    async def scenario() -> None:
        async with server() as srv, RenderClient(RenderConfig(model_name="m", url=srv.url)) as client:
            body = {"model": "claude", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}], "thinking": {"type": "disabled"}}
            assert (await client.render("messages", body)).ok and client.messages_route
            assert orjson.loads(srv.bodies[-1]) == {**body, "model": "m"}
            assert (await client.render("responses", {"input": "x"})).reason == "unsupported_body"

    run(scenario)
