"""The mid-run engine restart (which engine, when, how) and decision latency over router replicas."""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Awaitable, Callable, Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from ppc_extproc_lab.localcluster import free_port
from ppc_extproc_lab.workload.disturbance import EngineRestart, RestartRecord, busiest_engine, run_restart
from ppc_extproc_lab.workload.generator import Workload
from ppc_extproc_lab.workload.probes import decision_latency
from ppc_extproc_lab.workload.spec import WorkloadSpec

SPEC = WorkloadSpec(tenants=4, users_per_tenant=1, context_tokens=8, question_tokens=2, output_tokens=1)
# matched context tokens per (tenant, engine): tenant 0 on e0, tenants 1 and 2 on e1 (2 holds
# more there), tenant 3 tied between both (counts for neither).
HELD = {0: (8, 0), 1: (0, 8), 2: (4, 8), 3: (8, 8)}


class FakeEngines:
    """Two engines answering ``/mock/match`` from ``HELD`` and counting ``/mock/restart``."""

    def __init__(self, workload: Workload) -> None:
        self.by_context = {tuple(workload.context(t)): t for t in range(SPEC.tenants)}
        self.restarts = [0, 0]
        self.urls: list[str] = []

    def app(self, index: int) -> web.Application:
        async def match(request: web.Request) -> web.Response:
            prompt = tuple((await request.json())["prompt"])
            tenant = self.by_context[prompt]
            return web.json_response({"matched_tokens": HELD[tenant][index], "cached_tokens": 0})

        async def restart(_: web.Request) -> web.Response:
            self.restarts[index] += 1
            return web.json_response({"status": "restarted"})

        app = web.Application()
        app.router.add_post("/mock/match", match)
        app.router.add_post("/mock/restart", restart)
        return app


def run_against_fakes(
    restart: EngineRestart,
    restart_process: Callable[[int], Awaitable[None]] | None = None,
) -> tuple[RestartRecord, FakeEngines, float]:
    """Serve two fake engines, run ``run_restart`` on a clock started now; (record, fakes, clock at end)."""
    workload = Workload(SPEC)
    fakes = FakeEngines(workload)

    async def no_process(index: int) -> None:
        raise AssertionError("process restart in mock mode")

    async def main() -> tuple[RestartRecord, float]:
        runners = []
        for i in range(2):
            runner = web.AppRunner(fakes.app(i))
            await runner.setup()
            port = free_port()
            await web.TCPSite(runner, "127.0.0.1", port).start()
            runners.append(runner)
            fakes.urls.append(f"http://127.0.0.1:{port}")
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        try:
            record = await run_restart(
                restart, fakes.urls, workload, now=lambda: loop.time() - t0,
                restart_process=restart_process or no_process,
            )  # fmt: skip
            return record, loop.time() - t0
        finally:
            for runner in runners:
                await runner.cleanup()

    record, end = asyncio.run(main())
    return record, fakes, end


def test_restarts_the_engine_holding_most_tenants_at_the_given_time() -> None:
    record, fakes, _ = run_against_fakes(EngineRestart(0.2))
    assert fakes.restarts == [0, 1]
    assert record.engine == 1
    assert record.endpoint == fakes.urls[1].removeprefix("http://")
    assert record.tenants == [1, 2]
    assert record.tenants_per_engine == [1, 2]
    assert record.at_s >= 0.2
    assert record.mode == "mock" and record.error is None


def test_process_mode_restarts_through_the_callback() -> None:
    called: list[int] = []

    async def restart_process(index: int) -> None:
        called.append(index)

    record, fakes, _ = run_against_fakes(EngineRestart(0.0, "process"), restart_process)
    assert called == [1]
    assert fakes.restarts == [0, 0]
    assert record.mode == "process" and record.error is None


def test_a_failed_restart_is_recorded() -> None:
    async def broken(index: int) -> None:
        raise RuntimeError("engine did not come back")

    record, _, _ = run_against_fakes(EngineRestart(0.0, "process"), broken)
    assert record.error == "RuntimeError: engine did not come back"


def test_busiest_engine_ties_go_to_the_lowest_index() -> None:
    assert busiest_engine([[1], [2, 3], [4, 5]]) == 1
    assert busiest_engine([[], []]) == 0


@pytest.mark.parametrize(("at_s", "mode"), [(-1.0, "mock"), (1.0, "reboot")])
def test_engine_restart_rejects_bad_values(at_s: float, mode: str) -> None:
    with pytest.raises(ValueError):
        EngineRestart(at_s, mode)  # type: ignore[arg-type]


# -- decision latency summed over replicas ---------------------------------------------------


def _metrics(observations: Sequence[float]) -> bytes:
    registry = CollectorRegistry()
    hist = Histogram(
        "ppc_extproc_decision_duration_seconds", "decision", buckets=(0.001, 0.005, 0.01), registry=registry
    )
    for v in observations:
        hist.observe(v)
    return generate_latest(registry)


@pytest.fixture
def metrics_servers() -> Iterator[Callable[[Sequence[bytes]], list[str]]]:
    servers: list[ThreadingHTTPServer] = []

    def serve(bodies: Sequence[bytes]) -> list[str]:
        urls = []
        for body in bodies:

            class Handler(BaseHTTPRequestHandler):
                payload = body

                def do_GET(self) -> None:
                    self.send_response(200)
                    self.end_headers()
                    self.wfile.write(self.payload)

                def log_message(self, *args: object) -> None:
                    pass

            server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
            threading.Thread(target=server.serve_forever, daemon=True).start()
            servers.append(server)
            urls.append(f"http://127.0.0.1:{server.server_address[1]}")
        return urls

    yield serve
    for server in servers:
        server.shutdown()
        server.server_close()


def test_decision_latency_merges_replicas(metrics_servers: Callable[[Sequence[bytes]], list[str]]) -> None:
    a, b = metrics_servers([_metrics([0.0005] * 98), _metrics([0.008] * 2)])
    merged = decision_latency([a, b])
    assert merged is not None
    assert merged.count == 100
    assert merged.per_replica == (98, 2)
    assert merged.mean_s == pytest.approx((98 * 0.0005 + 2 * 0.008) / 100)
    assert merged.p99_le_s == 0.01  # 98 % fall in the first bucket: the 99th needs replica b's
    alone = decision_latency(a)
    assert alone is not None and alone.per_replica == (98,) and alone.p99_le_s == 0.001


def test_decision_latency_without_answers(metrics_servers: Callable[[Sequence[bytes]], list[str]]) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    assert decision_latency([dead], timeout_s=1) is None
    (empty,) = metrics_servers([_metrics([])])
    partial = decision_latency([empty, dead], timeout_s=1)
    assert partial is not None and partial.count == 0 and math.isnan(partial.mean_s)
    assert partial.per_replica == (0, 0)
