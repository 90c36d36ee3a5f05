"""gRPC health on the ext_proc port: ``liveness`` always serves; ``readiness``, ``""`` and the
ext_proc service name serve once the configuration is loaded and discovery has produced its first
endpoint list, as llm-d's EPP health server does (``llm-d/llm-d-router: cmd/epp/runner/health.go``).
Unknown names answer NOT_FOUND."""

from __future__ import annotations

from grpc_health.v1 import health, health_pb2

__all__ = ["EXTPROC_SERVICE", "Health"]

EXTPROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
_READINESS_NAMES = ("", "readiness", EXTPROC_SERVICE)


class Health:
    """Wraps grpc's aio ``HealthServicer`` with the endpoint picker's service names."""

    def __init__(self) -> None:
        self.servicer = health.aio.HealthServicer()
        self.ready = False

    async def start(self) -> None:
        await self.servicer.set("liveness", health_pb2.HealthCheckResponse.SERVING)
        await self.set_ready(False)

    async def set_ready(self, ready: bool) -> None:
        self.ready = ready
        status = health_pb2.HealthCheckResponse.SERVING if ready else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in _READINESS_NAMES:
            await self.servicer.set(name, status)

    async def shutdown(self) -> None:
        """Graceful shutdown: every name reports NOT_SERVING (liveness too) from now on."""
        self.ready = False
        await self.servicer.enter_graceful_shutdown()
