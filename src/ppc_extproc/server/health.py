"""gRPC health on the ext_proc port: ``liveness`` always serves; ``readiness``, ``""`` and the
ext_proc service name serve once the configuration is loaded and discovery has produced its first
endpoint list, as llm-d's EPP health server does (``llm-d/llm-d-router: cmd/epp/runner/health.go``).
Unknown names answer NOT_FOUND."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

__all__ = ["EXTPROC_SERVICE", "LIVENESS_SERVICE", "READINESS_SERVICE", "Background", "Health", "LeaderElection", "ProbeHealthServicer"]

EXTPROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
_READINESS_NAMES = ("", "readiness", EXTPROC_SERVICE)
_SERVING: int = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING: int = health_pb2.HealthCheckResponse.NOT_SERVING
_UNKNOWN: int = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN


class Background(Protocol):
    """A task running beside the service (a CRD watch) until its stop event."""

    async def run(self, stop: asyncio.Event) -> None:
        """Run until ``stop`` is set."""


class LeaderElection(Protocol):
    """A leader election the probe health consults (``discovery.kubernetes.lease.LeaderElector``)."""

    is_leader: bool

    async def run(self, stop: asyncio.Event) -> None:
        """Contend until ``stop``; release leadership on the way out."""


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


LIVENESS_SERVICE = "liveness"
READINESS_SERVICE = "readiness"


class ProbeHealthServicer(health_pb2_grpc.HealthServicer):  # type: ignore[misc]
    """The health server llm-d serves on ``--grpc-health-port`` (``llm-d/llm-d-router:
    cmd/epp/runner/health.go``), answered from the live state at each ``Check``:

    - without leader election every service name (the chart probes ``inference-extension``)
      answers readiness: SERVING once ready, NOT_SERVING before and while draining;
    - with it, ``liveness`` always serves; ``readiness``, ``""`` and the ext_proc service serve
      when ready, leading and not draining; any other name is SERVICE_UNKNOWN.
    ``Watch`` is unimplemented, as in llm-d.
    """

    def __init__(self, is_ready: Callable[[], bool], *, leader_election: bool = False,
                 is_leader: Callable[[], bool] = lambda: True) -> None:
        self._is_ready = is_ready
        self._is_leader = is_leader
        self.leader_election = leader_election
        self.draining = False

    def status(self, service: str) -> int:
        """The serving status ``Check`` answers for ``service``."""
        ready = self._is_ready() and not self.draining
        if not self.leader_election:
            return _SERVING if ready else _NOT_SERVING
        if service == LIVENESS_SERVICE:
            return _SERVING
        if service in ("", READINESS_SERVICE, EXTPROC_SERVICE):
            return _SERVING if ready and self._is_leader() else _NOT_SERVING
        return _UNKNOWN

    async def Check(self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext[Any, Any]) -> health_pb2.HealthCheckResponse:
        return health_pb2.HealthCheckResponse(status=self.status(request.service))

    async def Watch(self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Watch is not implemented")
