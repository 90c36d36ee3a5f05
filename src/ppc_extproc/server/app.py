"""Assemble and run the service: configuration → plugins → router → gRPC + admin servers.

    serve(ServeOptions(...))   runs until SIGTERM/SIGINT (or ``stop`` is set), then: health goes
                               NOT_SERVING, open streams drain for a bounded time, KV-event
                               subscribers close, and the coroutine returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import structlog
from aiohttp import web
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc
from grpc_health.v1 import health_pb2_grpc
from prometheus_client import CollectorRegistry

from ppc_extproc.config.epp import LoadedConfig, load_config
from ppc_extproc.discovery import StaticDiscovery
from ppc_extproc.errors import ConfigError
from ppc_extproc.observability.metrics import Metrics, StateCollector
from ppc_extproc.plugins.registry import Services
from ppc_extproc.scheduling.pool import EndpointPool
from ppc_extproc.scheduling.router import Router
from ppc_extproc.scheduling.types import Endpoint
from ppc_extproc.server.admin import build_admin_app
from ppc_extproc.server.extproc import ExternalProcessor
from ppc_extproc.server.health import Health
from ppc_extproc.server.stream import BodyMode, StreamOptions

__all__ = ["ServeOptions", "Service", "configure_gc", "serve"]

log = structlog.get_logger(__name__)

_TICK_SECONDS = 0.1
_GC_GEN0_THRESHOLD = 50_000


@dataclass
class ServeOptions:
    config_file: str | None = None
    grpc_address: str = "0.0.0.0"
    grpc_port: int = 9002
    admin_address: str = "127.0.0.1"
    #: 0 picks a free port; None disables the admin server.
    admin_port: int | None = 9090
    #: Static endpoints (``--endpoints``); None uses the configuration's discovery.
    endpoints: list[Endpoint] | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    max_body_bytes: int = 16 * 1024 * 1024
    default_body_mode: BodyMode = BodyMode.FULL_DUPLEX_STREAMED
    json_errors: bool = False
    #: Bound on waiting for open streams at shutdown.
    drain_seconds: float = 10.0
    services: Services = field(default_factory=Services)
    #: A discovery source object (``async run(pool, stop)``) overriding ``endpoints`` and the
    #: configuration's discovery — for embedding ppc-extproc with another endpoint source.
    discovery: Any = None


class Service:
    """The running service's parts, for the admin API and for tests."""

    def __init__(self, options: ServeOptions, loaded: LoadedConfig) -> None:
        self.options = options
        self.loaded = loaded
        self.pool = EndpointPool()
        engine_metrics = loaded.services.engine_metrics
        if engine_metrics is not None and hasattr(engine_metrics, "attach"):
            engine_metrics.attach(self.pool)  # scrapes follow the endpoint set
        hooks = [p for p in loaded.plugins.values() if hasattr(p, "pre_request") or hasattr(p, "response_complete")]
        self.router = Router(self.pool, loaded.producers, loaded.profile, hooks, inflight=loaded.services.inflight)
        self.registry = CollectorRegistry()
        self.metrics = Metrics(self.registry)
        self.registry.register(StateCollector(self.state_for_metrics))
        self.health = Health()
        stream_options = StreamOptions(options.max_body_bytes, options.default_body_mode, options.json_errors)
        self.extproc = ExternalProcessor(self.router, stream_options, self.metrics)
        self.grpc_port = 0
        self.admin_port = 0
        self._stop: tuple[asyncio.AbstractEventLoop, asyncio.Event] | None = None
        self.discovery: Any = options.discovery or (
            StaticDiscovery(options.endpoints) if options.endpoints is not None else loaded.discovery
        )
        if self.discovery is None:
            raise ConfigError(
                "dataLayer.discovery",
                "no endpoints: pass --endpoints ip:port,… or configure a discovery plugin "
                "(e.g. file-discovery) under dataLayer.discovery",
            )
        for plugin in loaded.plugins.values():
            if callable(getattr(plugin, "extract", None)):
                self.pool.subscribe(plugin.extract)

    @property
    def ready(self) -> bool:
        return self.health.ready

    def request_stop(self) -> None:
        """Begin a graceful shutdown, from any thread (what SIGTERM does)."""
        if self._stop is not None:
            loop, stop = self._stop
            with contextlib.suppress(RuntimeError):  # the loop already finished: nothing to stop
                loop.call_soon_threadsafe(stop.set)

    def state_for_metrics(self) -> dict[str, Any]:
        producers = []
        for producer in self.loaded.producers:
            index = getattr(producer, "index", None)
            if index is None or not hasattr(index, "stats"):
                continue
            producers.append({
                "name": producer.name, "index": index.stats(), "stats": producer.stats,
                "speculative_pending": producer.speculative.pending(),
            })
        return {"inflight": self.router.inflight.snapshot(), "endpoints": len(self.pool), "producers": producers}

    def debug_state(self) -> dict[str, Any]:
        producers = {}
        for producer in self.loaded.producers:
            entry: dict[str, Any] = {"type": producer.type_name}
            index = getattr(producer, "index", None)
            if index is not None and hasattr(index, "entries_per_endpoint"):
                stats = index.stats()
                entry["index"] = {
                    "requestKeys": stats.request_keys, "engineKeys": stats.engine_keys,
                    "entries": stats.entries, "entriesPerEndpoint": index.entries_per_endpoint(),
                    "evictedRequestKeys": stats.evicted_request_keys,
                }
                entry["speculativePendingRequests"] = producer.speculative.pending()
                entry["kvEvents"] = producer.stats.snapshot()
            producers[producer.name] = entry
        return {
            "ready": self.ready,
            "endpoints": [
                {"endpoint": e.id, "name": e.name, "rank": e.rank, "labels": dict(e.labels)} for e in self.pool.endpoints()
            ],
            "inflight": self.router.inflight.snapshot(),
            "producers": producers,
            "config": {"source": self.loaded.source, "warnings": self.loaded.warnings},
        }


def configure_gc() -> None:
    """The KV-event path allocates many short-lived containers (decoded batches): collect the
    young generation less often, and keep everything built at startup out of later collections."""
    gc.set_threshold(_GC_GEN0_THRESHOLD, *gc.get_threshold()[1:])
    gc.freeze()


async def serve(
    options: ServeOptions,
    *,
    stop: asyncio.Event | None = None,
    on_started: Callable[[Service], None] | None = None,
    on_ready: Callable[[Service], None] | None = None,
    install_signal_handlers: bool = True,
) -> None:
    """Run the service until ``stop`` is set or SIGTERM/SIGINT arrives. ``on_started`` is called
    once the ports are bound, ``on_ready`` once the first endpoint list is in."""
    stop = stop or asyncio.Event()
    loaded = load_config(options.config_file, options.services)
    configure_gc()
    service = Service(options, loaded)
    loop = asyncio.get_running_loop()
    service._stop = (loop, stop)
    if install_signal_handlers:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)

    server = grpc.aio.server(options=[
        ("grpc.so_reuseport", 0),
        ("grpc.max_receive_message_length", options.max_body_bytes + (1 << 20)),
        ("grpc.max_send_message_length", options.max_body_bytes + (1 << 20)),
    ])
    external_processor_pb2_grpc.add_ExternalProcessorServicer_to_server(service.extproc, server)
    health_pb2_grpc.add_HealthServicer_to_server(service.health.servicer, server)
    address = f"{options.grpc_address}:{options.grpc_port}"
    if options.tls_cert_file or options.tls_key_file:
        if not (options.tls_cert_file and options.tls_key_file):
            raise ConfigError("--tls-cert-file", "TLS needs both --tls-cert-file and --tls-key-file")
        credentials = grpc.ssl_server_credentials(
            [(Path(options.tls_key_file).read_bytes(), Path(options.tls_cert_file).read_bytes())]
        )
        service.grpc_port = server.add_secure_port(address, credentials)
    else:
        service.grpc_port = server.add_insecure_port(address)

    started: list[Any] = []
    runner: web.AppRunner | None = None
    tasks: list[asyncio.Task[Any]] = []
    try:
        for plugin in loaded.plugins.values():
            if callable(getattr(plugin, "start", None)):
                plugin.start()
                started.append(plugin)
        await _start_services(loaded.services)
        await service.health.start()
        await server.start()
        if options.admin_port is not None:
            app = build_admin_app(
                service.router, service.registry, lambda: service.ready, service.debug_state,
                lambda: list(service.extproc.recent_decisions),
            )
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, options.admin_address, options.admin_port)
            await site.start()
            service.admin_port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        if on_started is not None:
            on_started(service)
        discovery_stop = asyncio.Event()
        tasks.append(asyncio.create_task(service.discovery.run(service.pool, discovery_stop), name="discovery"))
        tasks.append(asyncio.create_task(_housekeeping(service), name="housekeeping"))
        await _wait_synced(service, tasks[0], stop)
        if not stop.is_set():
            await service.health.set_ready(True)
            log.info(
                "service_ready", grpc_port=service.grpc_port, admin_port=service.admin_port,
                endpoints=len(service.pool), config=loaded.source,
            )
            if on_ready is not None:
                on_ready(service)
        await stop.wait()
        log.info("service_stopping", open_streams=service.extproc.active)
        discovery_stop.set()
    finally:
        await service.health.shutdown()
        await server.stop(options.drain_seconds)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if runner is not None:
            await runner.cleanup()
        await _stop_services(loaded.services)
        for plugin in reversed(started):
            with contextlib.suppress(Exception):
                plugin.stop(5.0)
        log.info("service_stopped")


async def _wait_synced(service: Service, discovery: asyncio.Task[Any], stop: asyncio.Event) -> None:
    """Wait for the first endpoint list; a discovery that fails at startup is fatal."""
    while not service.pool.synced and not stop.is_set():
        if discovery.done():
            discovery.result()  # raises the discovery error
            return
        await asyncio.sleep(0.01)


async def _housekeeping(service: Service) -> None:
    """Speculative-entry expiry, and a safety sweep of in-flight requests never finished."""
    ticks = 0
    while True:
        await asyncio.sleep(_TICK_SECONDS)
        ticks += 1
        for producer in service.loaded.producers:
            tick = getattr(producer, "tick", None)
            if tick is not None:
                try:
                    tick()
                except Exception:
                    log.exception("producer_tick_failed", producer=producer.name)
        if ticks % 600 == 0:
            service.router.inflight.expire()


async def _start_services(services: Services) -> None:
    source = services.engine_metrics
    if source is not None and hasattr(source, "start"):
        result = source.start()
        if asyncio.iscoroutine(result):
            await result


async def _stop_services(services: Services) -> None:
    source = services.engine_metrics
    if source is not None and hasattr(source, "stop"):
        with contextlib.suppress(Exception):
            result = source.stop()
            if asyncio.iscoroutine(result):
                await result
