"""Assemble and run the service: configuration → plugins → router → gRPC + admin servers.

    serve(ServeOptions(...))   runs until SIGTERM/SIGINT (or ``stop`` is set), then: health goes
                               NOT_SERVING, open streams drain for a bounded time, KV-event
                               subscribers close, and the coroutine returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
import structlog
from aiohttp import web
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc
from grpc_health.v1 import health_pb2_grpc
from prometheus_client import CollectorRegistry

from ppc_extproc import __version__
from ppc_extproc.config.epp import LoadedConfig, load_config, load_config_text
from ppc_extproc.discovery import StaticDiscovery
from ppc_extproc.errors import BindError, ConfigError
from ppc_extproc.framework import Discovery, Endpoint, Lifecycle, PluginState
from ppc_extproc.observability.llmd_metrics import PoolCollector, PoolSnapshot, disagg_families, kv_cache_families
from ppc_extproc.observability.metrics import Metrics, ServiceState, StateCollector
from ppc_extproc.observability.tracing import RequestTracer
from ppc_extproc.plugins.registry import Services
from ppc_extproc.scheduling.objectives import ModelRewrites, Objectives
from ppc_extproc.scheduling.pool import EndpointPool
from ppc_extproc.scheduling.router import Router
from ppc_extproc.scheduling.saturation import SaturationDetector
from ppc_extproc.server.admin import MetricsAuth, build_admin_app, plugin_state_json
from ppc_extproc.server.extproc import ExternalProcessor
from ppc_extproc.server.flow import build_admission
from ppc_extproc.server.health import Background, Health, LeaderElection, ProbeHealthServicer
from ppc_extproc.server.process import configure_gc, configure_malloc
from ppc_extproc.server.stream import BodyMode, StreamOptions
from ppc_extproc.server.tls import server_credentials

__all__ = ["ServeOptions", "Service", "serve"]

log = structlog.get_logger(__name__)

#: A ticker that names no next time is ticked this often.
_TICK_SECONDS = 0.1
#: Ticks of one plugin are at least this far apart (many near deadlines are served by one tick).
_MIN_TICK_SECONDS = 0.05
#: Longest sleep of the housekeeping task, in real seconds (a clock that jumps is seen by then).
_MAX_WAIT_SECONDS = 1.0
#: The safety sweep of in-flight requests never finished.
_INFLIGHT_SWEEP_SECONDS = 60.0


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
    #: Share of responses whose usage is read when Envoy sends no response bodies (``StreamOptions``).
    usage_sample_rate: float = 0.01
    #: Bound on waiting for open streams at shutdown.
    drain_seconds: float = 10.0
    services: Services = field(default_factory=Services)
    #: Bind the gRPC port with SO_REUSEPORT (``serve --workers``: several processes share it).
    reuse_port: bool = False
    #: This process's index among ``serve --workers`` (None: a single process).
    worker_index: int | None = None
    #: A discovery source overriding ``endpoints`` and the configuration's discovery (Kubernetes,
    #: or an embedding application's own endpoint source).
    discovery: Discovery | None = None
    #: The configuration as text (``--config-text``), instead of ``config_file``.
    config_text: str | None = None
    #: A separate gRPC health server (llm-d's ``--grpc-health-port``); None: health on the ext_proc
    #: port only.
    health_port: int | None = None
    health_address: str = "0.0.0.0"
    #: llm-d's probe semantics with leader election on (``ProbeHealthServicer``).
    leader_election: bool = False
    #: The election deciding leadership (only the leader is ready); None: every replica leads.
    leader_elector: LeaderElection | None = None
    #: InferenceModelRewrite rules the request path applies, and what keeps them current.
    rewrites: ModelRewrites | None = None
    objectives: Objectives | None = None
    background: tuple[Background, ...] = ()
    #: Bearer-token review of ``/metrics`` (llm-d's ``--metrics-endpoint-auth``); None: open.
    metrics_auth: MetricsAuth | None = None
    #: OpenTelemetry spans of the request path (llm-d's ``--tracing``); None: off.
    tracer: RequestTracer | None = None
    #: After the stop signal: readiness NOT_SERVING while ext_proc keeps serving this long.
    drain_timeout_seconds: float = 0.0
    #: gRPC message limits (``--grpc-max-*-msg-size``); None: ``max_body_bytes`` + 1 MiB.
    grpc_max_recv_bytes: int | None = None
    grpc_max_send_bytes: int | None = None
    #: Mount ``/debug/*`` on the admin server (off when it listens beyond the pod).
    admin_debug: bool = True
    #: Honour Envoy's endpoint subset hint (llm-d's ``--disable-endpoint-subset-filter`` clears it).
    honour_subset: bool = True
    #: TLS on the ext_proc port with a certificate made at start when no certificate files are
    #: given (llm-d's ``--secure-serving`` without ``--cert-path``).
    tls_self_signed: bool = False
    #: Re-read ``tls_cert_file``/``tls_key_file`` when they change (llm-d's ``--enable-cert-reload``).
    tls_cert_reload: bool = False
    #: The InferencePool's name and namespace, for llm-d's pool and scheduler metric labels.
    pool_name: str = ""
    pool_namespace: str = ""


class Service:
    """The running service's parts, for the admin API and for tests."""

    def __init__(self, options: ServeOptions, loaded: LoadedConfig) -> None:
        self.options = options
        self.loaded = loaded
        self.pool = EndpointPool()
        services = loaded.services
        # Health first, so an endpoint's state exists before any source reports on it; then the
        # data layer's sources (and through them the extractors) follow the endpoint set.
        self.pool.subscribe(services.health.on_endpoint_event)
        self.pool.subscribe(loaded.data_layer.notify)
        self.router = Router(self.pool, loaded.pipeline, inflight=services.inflight, health=services.health)
        self.registry = CollectorRegistry()
        self.metrics = Metrics(self.registry)
        self.registry.register(StateCollector(self.state_for_metrics))
        self.metrics.llmd.namespace = options.pool_namespace
        self.registry.register(PoolCollector(
            self.pool_for_metrics, (os.environ.get("PPC_EXTPROC_COMMIT", ""), __version__),
            kv=lambda: itertools.chain(kv_cache_families(states := self.plugin_states()), disagg_families(states)),
        ))
        self.health = Health()
        elector = options.leader_elector
        self.probe_health = ProbeHealthServicer(
            lambda: self.health.ready, leader_election=options.leader_election,
            is_leader=(lambda: elector.is_leader) if elector is not None else (lambda: True))
        self.health_port = 0
        #: Admitters and flow control (None: neither is configured).
        self.admission, self.flow_controller = build_admission(loaded, self.pool, self.registry, options.pool_name)
        stream_options = StreamOptions(
            options.max_body_bytes, options.default_body_mode, options.json_errors, options.usage_sample_rate,
            honour_subset=options.honour_subset, rewrites=options.rewrites, objectives=options.objectives,
            tracer=options.tracer,
            saturation=SaturationDetector(lambda: [e.id for e in self.pool.endpoints()],
                                          services.engine_metrics, self.router.inflight),
            admission=self.admission,
        )
        self.extproc = ExternalProcessor(self.router, stream_options, self.metrics)
        self.grpc_port = 0
        self.admin_port = 0
        self._stop: tuple[asyncio.AbstractEventLoop, asyncio.Event] | None = None
        discovery = options.discovery or (
            StaticDiscovery(options.endpoints) if options.endpoints is not None else loaded.discovery
        )
        if discovery is None:
            raise ConfigError(
                "dataLayer.discovery",
                "no endpoints: pass --endpoints ip:port,… or configure a discovery plugin "
                "(e.g. file-discovery) under dataLayer.discovery",
            )
        self.discovery: Discovery = discovery

    @property
    def ready(self) -> bool:
        return self.health.ready

    def request_stop(self) -> None:
        """Begin a graceful shutdown, from any thread (what SIGTERM does)."""
        if self._stop is not None:
            loop, stop = self._stop
            with contextlib.suppress(RuntimeError):  # the loop already finished: nothing to stop
                loop.call_soon_threadsafe(stop.set)

    def plugin_states(self, *, detailed: bool = False) -> list[PluginState]:
        return [plugin.state(detailed=detailed) for plugin in self.loaded.roles.state_reporters]

    def state_for_metrics(self) -> ServiceState:
        health = self.router.health
        routable = {ep: not reasons for ep, reasons in self._health_view().items()}
        return ServiceState(self.router.inflight.snapshot(), len(self.pool), self.plugin_states(), routable,
                            health.transitions(), health.panics)  # fmt: skip

    def pool_for_metrics(self) -> PoolSnapshot:
        engines = self.loaded.services.engine_metrics
        endpoints: dict[str, tuple[int | None, int | None, float | None]] = {}
        for endpoint in self.pool.endpoints():
            m = engines.snapshot(endpoint.id)
            fresh = m is not None and not m.stale
            # llm-d's label is the endpoint's ``ID.Name`` (``<pod>-rank-<i>``), without the namespace.
            endpoints[endpoint.name.rpartition("/")[2] or endpoint.id] = (
                m.waiting if fresh and m else None, m.running if fresh and m else None, m.kv_usage if fresh and m else None
            )
        return PoolSnapshot(self.options.pool_name, endpoints)

    def _health_view(self) -> dict[str, list[str]]:
        down = self.router.health.down()
        return {e.id: down.get(e.id, []) for e in self.pool.endpoints()}

    def debug_state(self) -> dict[str, Any]:
        return {
            "ready": self.ready,
            "endpoints": [
                {"endpoint": e.id, "name": e.name, "rank": e.rank, "labels": dict(e.labels)} for e in self.pool.endpoints()
            ],
            "inflight": self.router.inflight.snapshot(),
            "health": self.router.health.view(),
            "plugins": {state.name: plugin_state_json(state) for state in self.plugin_states(detailed=True)},
            "config": {"source": self.loaded.source, "warnings": self.loaded.warnings, "injected": self.loaded.injected},
        }


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
    if options.config_text is not None:
        loaded = load_config_text(options.config_text, "--config-text", options.services)
    else:
        loaded = load_config(options.config_file, options.services)
    configure_gc()
    configure_malloc()
    service = Service(options, loaded)
    loop = asyncio.get_running_loop()
    service._stop = (loop, stop)
    if install_signal_handlers:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        # The configuration is read once; a SIGHUP (a closed terminal, a habit from other
        # daemons) is logged and otherwise ignored instead of ending the process.
        loop.add_signal_handler(signal.SIGHUP, lambda: log.info("sighup_ignored"))

    server = grpc.aio.server(options=[
        # Off by default, so a port already in use is an error rather than a silently shared port.
        ("grpc.so_reuseport", 1 if options.reuse_port else 0),
        ("grpc.max_receive_message_length", options.grpc_max_recv_bytes or options.max_body_bytes + (1 << 20)),
        ("grpc.max_send_message_length", options.grpc_max_send_bytes or options.max_body_bytes + (1 << 20)),
    ])
    external_processor_pb2_grpc.add_ExternalProcessorServicer_to_server(service.extproc, server)
    health_pb2_grpc.add_HealthServicer_to_server(service.health.servicer, server)
    address = f"{options.grpc_address}:{options.grpc_port}"
    credentials = server_credentials(options.tls_cert_file, options.tls_key_file,
                                     self_signed=options.tls_self_signed, reload=options.tls_cert_reload)
    if credentials is not None:
        service.grpc_port = _add_port(options, lambda: server.add_secure_port(address, credentials))
    else:
        service.grpc_port = _add_port(options, lambda: server.add_insecure_port(address))

    health_server: grpc.aio.Server | None = None
    if options.health_port is not None:
        # Plaintext, as kubelet's gRPC probes are.
        health_server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        health_pb2_grpc.add_HealthServicer_to_server(service.probe_health, health_server)
        service.health_port = health_server.add_insecure_port(f"{options.health_address}:{options.health_port}")

    started: list[Lifecycle] = []
    runner: web.AppRunner | None = None
    tasks: list[asyncio.Task[Any]] = []
    lease_stop = asyncio.Event()
    election: asyncio.Task[None] | None = None
    try:
        for plugin in loaded.roles.lifecycle:
            await plugin.start()
            started.append(plugin)
        await service.health.start()
        await server.start()
        if health_server is not None:
            await health_server.start()
        if options.admin_port is not None:
            app = build_admin_app(
                service.router, service.registry, lambda: service.ready, service.debug_state,
                lambda: list(service.extproc.recent_decisions), max_body_bytes=options.max_body_bytes,
                debug=options.admin_debug, metrics_auth=options.metrics_auth,
            )
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, options.admin_address, options.admin_port)
            try:
                await site.start()
            except OSError as exc:
                raise BindError.classify(exc, options.admin_address, options.admin_port,
                                         host_flag="--admin-address", port_flag="--admin-port") from None
            service.admin_port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        if on_started is not None:
            on_started(service)
        discovery_stop = asyncio.Event()
        tasks.append(asyncio.create_task(service.discovery.run(service.pool, discovery_stop), name="discovery"))
        tasks.append(asyncio.create_task(_housekeeping(service), name="housekeeping"))
        if options.leader_elector is not None:
            election = asyncio.create_task(options.leader_elector.run(lease_stop), name="leader-election")
        tasks.extend(asyncio.create_task(job.run(discovery_stop), name=type(job).__name__) for job in options.background)
        await _wait_synced(service, tasks[0], stop)
        if not stop.is_set():
            await service.health.set_ready(True)
            log.info(
                "service_ready", grpc_port=service.grpc_port, admin_port=service.admin_port,
                endpoints=len(service.pool), config=loaded.source, worker=options.worker_index,
            )
            if on_ready is not None:
                on_ready(service)
        await stop.wait()
        log.info("service_stopping", open_streams=service.extproc.active)
        await _drain(service, options.drain_timeout_seconds)
        if service.flow_controller is not None:
            service.flow_controller.close()  # still queued: 503 rejected-shutting-down
        discovery_stop.set()
    finally:
        await service.health.shutdown()
        lease_stop.set()  # after the drain window: the lease is released for a successor
        if election is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(election, 10.0)
        if health_server is not None:
            await health_server.stop(0)
        await server.stop(options.drain_seconds)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if runner is not None:
            await runner.cleanup()
        for plugin in reversed(started):
            try:
                await asyncio.wait_for(plugin.stop(), 10.0)
            except Exception:
                log.exception("plugin_stop_failed", plugin=plugin.name)
        if options.tracer is not None:
            await asyncio.to_thread(options.tracer.shutdown)
        log.info("service_stopped")


def _add_port(options: ServeOptions, add: Callable[[], int]) -> int:
    """Bind the gRPC port. gRPC says only "Failed to bind" (and logs its own line), so a plain
    socket bound to the same address first tells why: the address does not exist here, the port
    is taken, ..."""
    host, port = options.grpc_address, options.grpc_port
    try:
        family, type_, proto, _, addr = socket.getaddrinfo(
            host.strip("[]"), port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]  # fmt: skip
        with socket.socket(family, type_, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if options.reuse_port:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            probe.bind(addr)
    except OSError as why:
        raise BindError.classify(why, host, port, host_flag="--grpc-address", port_flag="--grpc-port") from None
    try:
        return add()
    except RuntimeError as exc:
        raise BindError("--grpc-port", f"{host}:{port}", str(exc)) from None


async def _drain(service: Service, seconds: float) -> None:
    """llm-d's drain window (``cmd/epp/runner/runner.go``, ``runWithGracefulShutdown``): readiness
    goes NOT_SERVING so Kubernetes takes the pod out of the Service, while ext_proc keeps accepting
    streams for ``seconds`` (clients still resolving the old endpoints are served, not refused)."""
    if seconds <= 0:
        return
    service.probe_health.draining = True
    await service.health.set_ready(False)
    log.info("service_draining", drain_timeout_seconds=seconds)
    await asyncio.sleep(seconds)


async def _wait_synced(service: Service, discovery: asyncio.Task[Any], stop: asyncio.Event) -> None:
    """Wait for the first endpoint list; a discovery that fails at startup is fatal."""
    while not service.pool.synced and not stop.is_set():
        if discovery.done():
            discovery.result()  # raises the discovery error
            return
        await asyncio.sleep(0.01)


async def _housekeeping(service: Service) -> None:
    """Plugins' housekeeping (speculative-entry expiry), each run when it said it is next due, and
    a safety sweep of in-flight requests never finished. Sleeps until the earliest is due."""
    clock = service.loaded.services.clock
    tickers = service.loaded.roles.tickers
    due = [0.0] * len(tickers)
    sweep_at = clock() + _INFLIGHT_SWEEP_SECONDS
    while True:
        now = clock()
        for i, plugin in enumerate(tickers):
            if now < due[i]:
                continue
            next_due: float | None = None
            try:
                next_due = plugin.tick(now)
            except Exception:
                log.exception("plugin_tick_failed", plugin=plugin.name)
            due[i] = now + _TICK_SECONDS if next_due is None else max(next_due, now + _MIN_TICK_SECONDS)
        if now >= sweep_at:
            sweep_at = now + _INFLIGHT_SWEEP_SECONDS
            service.router.inflight.expire()
        wait = min([sweep_at, *due]) - now
        await asyncio.sleep(min(max(wait, 0.0), _MAX_WAIT_SECONDS))
