"""A mock NVIDIA DCGM exporter: ``GET /metrics`` with ``DCGM_FI_DEV_GPU_UTIL`` per GPU, settable.

The exposition follows dcgm-exporter's (``DCGM_FI_DEV_GPU_UTIL{gpu, UUID, device, modelName,
Hostname, container, namespace, pod} <percent>``, a gauge); ``pod`` is omitted when the exporter
has no pod (a sidecar without Kubernetes mapping). ``POST /mock/gpu {"gpu": 0, "util": 95}`` sets
one GPU's utilisation; ``POST /mock/faults {"metrics_status": 503}`` answers ``/metrics`` with that
status (``null`` clears it). For the ``dcgm-data-source`` / ``dcgm-extractor`` tests::

    async with mock_dcgm("127.0.0.2", port, utils=[30.0, 80.0], pod="vllm-0") as exporter:
        exporter.set(1, 10.0)
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

from aiohttp import web

__all__ = ["MockDCGMExporter", "mock_dcgm"]


@dataclass
class MockDCGMExporter:
    """The exporter's state: one utilisation (percent) per GPU of one pod."""

    utils: list[float]
    pod: str | None = None
    namespace: str = "default"
    #: ``/metrics`` answers with this status instead, when set.
    metrics_status: int | None = None
    scrapes: int = 0
    runner: web.AppRunner | None = field(default=None, repr=False)

    def set(self, gpu: int, util: float) -> None:
        self.utils[gpu] = util

    def exposition(self) -> str:
        lines = ["# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).", "# TYPE DCGM_FI_DEV_GPU_UTIL gauge"]
        for i, util in enumerate(self.utils):
            labels = (f'gpu="{i}",UUID="GPU-mock-{i:04d}",device="nvidia{i}",modelName="Mock H100",'
                      f'Hostname="mock-node"')  # fmt: skip
            if self.pod is not None:
                labels += f',container="vllm",namespace="{self.namespace}",pod="{self.pod}"'
            lines.append(f"DCGM_FI_DEV_GPU_UTIL{{{labels}}} {util:g}")
        # Another family around it, as the real exporter serves dozens.
        lines += ["# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).", "# TYPE DCGM_FI_DEV_FB_USED gauge"]
        lines += [f'DCGM_FI_DEV_FB_USED{{gpu="{i}"}} 1024' for i in range(len(self.utils))]
        return "\n".join(lines) + "\n"

    def app(self) -> web.Application:
        async def metrics(request: web.Request) -> web.Response:
            self.scrapes += 1
            if self.metrics_status is not None:
                return web.Response(status=self.metrics_status, text="fault\n")
            return web.Response(text=self.exposition(), content_type="text/plain")

        async def gpu(request: web.Request) -> web.Response:
            body = await request.json()
            self.set(int(body["gpu"]), float(body["util"]))
            return web.json_response({"utils": self.utils})

        async def faults(request: web.Request) -> web.Response:
            body = await request.json()
            status = body.get("metrics_status")
            self.metrics_status = None if status is None else int(status)
            return web.json_response({"metrics_status": self.metrics_status})

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        app.router.add_post("/mock/gpu", gpu)
        app.router.add_post("/mock/faults", faults)
        return app


@contextlib.asynccontextmanager
async def mock_dcgm(
    host: str, port: int, *, utils: Sequence[float] = (0.0,), pod: str | None = None
) -> AsyncIterator[MockDCGMExporter]:
    """Serve a mock exporter on ``host:port`` until the block exits."""
    exporter = MockDCGMExporter(list(utils), pod)
    runner = web.AppRunner(exporter.app(), access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
        exporter.runner = runner
        yield exporter
    finally:
        await runner.cleanup()
