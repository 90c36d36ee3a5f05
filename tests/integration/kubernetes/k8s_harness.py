"""The real service (``serve()``) with Kubernetes discovery against the fake API server, on one loop.

``running_service`` starts ``serve()`` with a precise-prefix-cache-producer configuration and the
given discovery, and yields a handle that reads ``/debug/state`` from the admin port: the endpoint
set and the KV-event subscribers (``kvEvents`` sources) the running service holds. Subscribers
connect lazily to ``tcp://<pod ip>:<socketPort + rank>``, so no engine is needed; pod IPs are in
127.0.0.0/8 so nothing leaves the machine.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import grpc
from fake_apiserver import FakeApiServer
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ppc_extproc.discovery.kubernetes import KubernetesDiscovery, KubernetesDiscoveryConfig
from ppc_extproc.discovery.kubernetes.client import BackoffPolicy, WatchTimings
from ppc_extproc.framework import EndpointEvent
from ppc_extproc.server.app import ServeOptions, Service, serve

NAMESPACE = "llm"
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING

#: Production bounds except: quick retries (the outage tests would otherwise wait 0.8 s, 1.6 s, …).
TIMINGS = WatchTimings(connect_timeout_seconds=2.0, list_timeout_seconds=5.0, watch_grace_seconds=5.0,
                       backoff=BackoffPolicy(initial_seconds=0.05, max_seconds=0.4, jitter=0.5))


def epp_config(socket_port: int) -> str:
    return f"""
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: precise-prefix-cache-producer
  parameters: {{kvEventsConfig: {{podDiscoveryConfig: {{socketPort: {socket_port}}}}}}}
- type: prefix-cache-scorer
  parameters: {{prefixMatchInfoProducerName: precise-prefix-cache-producer}}
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins: [{{pluginRef: prefix-cache-scorer, weight: 1}}, {{pluginRef: max-score-picker}}]
"""


def write_kubeconfig(tmp_path: Path, url: str, token: str = "test-token") -> str:
    path = tmp_path / "kubeconfig"
    path.write_text(f"""apiVersion: v1
kind: Config
clusters: [{{name: fake, cluster: {{server: "{url}"}}}}]
users: [{{name: epp, user: {{token: {token}}}}}]
contexts: [{{name: fake, context: {{cluster: fake, user: epp, namespace: {NAMESPACE}}}}}]
current-context: fake
""")
    return str(path)


def pool_discovery(kubeconfig: str, pool_name: str = "qwen-pool", **kw: Any) -> KubernetesDiscovery:
    config = KubernetesDiscoveryConfig(namespace=NAMESPACE, pool_name=pool_name, kubeconfig=kubeconfig,
                                       timings=kw.pop("timings", TIMINGS), **kw)
    return KubernetesDiscovery(config, environ={})


def endpoints_of(state: dict[str, Any]) -> dict[str, int]:
    """endpoint id → rank."""
    return {e["endpoint"]: e["rank"] for e in state["endpoints"]}


def subscribers_of(state: dict[str, Any]) -> dict[str, str]:
    """endpoint id → the address its KV-event subscriber connects to."""
    kv = state["plugins"]["precise-prefix-cache-producer"]["kvEvents"]
    return {endpoint: entry["source"]["address"] for endpoint, entry in kv.items() if "source" in entry}


@dataclass
class Running:
    service: Service
    ready: asyncio.Event
    task: asyncio.Task[None]
    socket_port: int
    #: Every endpoint event the pool dispatched after start: (kind, endpoint id).
    events: list[tuple[str, str]] = field(default_factory=list)
    _http: aiohttp.ClientSession | None = None

    async def state(self) -> dict[str, Any]:
        assert self._http is not None
        async with self._http.get(f"http://127.0.0.1:{self.service.admin_port}/debug/state") as response:
            return await response.json()  # type: ignore[no-any-return]

    def sub(self, ip: str, rank: int = 0) -> str:
        return f"tcp://{ip}:{self.socket_port + rank}"

    async def until(self, check: Callable[[dict[str, Any]], bool], what: str, timeout: float = 15.0) -> dict[str, Any]:
        """Poll /debug/state until ``check(state)``; on timeout fail showing the last state."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            if self.task.done():
                self.task.result()
                raise AssertionError(f"the service stopped while waiting for {what}")
            state = await self.state()
            if check(state):
                return state
            if loop.time() > deadline:
                raise AssertionError(f"timed out waiting for {what}: endpoints {endpoints_of(state)}, "
                                     f"subscribers {subscribers_of(state)}")
            await asyncio.sleep(0.02)

    async def expect(self, endpoints: dict[str, int], subscribers: dict[str, str], what: str) -> None:
        """The endpoint set (id → rank) and the KV subscribers (id → address) the service holds."""
        await self.until(lambda s: endpoints_of(s) == endpoints and subscribers_of(s) == subscribers, what)

    async def health(self, service: str = "readiness") -> int:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{self.service.grpc_port}") as channel:
            reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            return int(reply.status)


@contextlib.asynccontextmanager
async def running_service(tmp_path: Path, discovery: Any, socket_port: int) -> AsyncIterator[Running]:
    config = tmp_path / "epp.yaml"
    config.write_text(epp_config(socket_port))
    options = ServeOptions(config_file=str(config), grpc_address="127.0.0.1", grpc_port=0, admin_port=0,
                           discovery=discovery)
    stop, started, ready = asyncio.Event(), asyncio.Event(), asyncio.Event()
    holder: dict[str, Service] = {}

    def on_started(service: Service) -> None:
        holder["service"] = service
        started.set()

    task = asyncio.create_task(serve(options, stop=stop, install_signal_handlers=False,
                                     on_started=on_started, on_ready=lambda _: ready.set()))
    try:
        waiter = asyncio.create_task(started.wait())
        await asyncio.wait([task, waiter], timeout=30, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        if task.done():
            task.result()
        assert "service" in holder, "the service did not start within 30 s"
        running = Running(holder["service"], ready, task, socket_port)
        running.service.pool.subscribe(lambda e: _record(running.events, e))
        running.events.clear()  # subscribe replays known endpoints; keep only what happens next
        async with aiohttp.ClientSession() as http:
            running._http = http
            yield running
    finally:
        stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 30)


def _record(events: list[tuple[str, str]], event: EndpointEvent) -> None:
    events.append((event.kind.name, event.endpoint.id))


@contextlib.asynccontextmanager
async def fake_api(**kw: Any) -> AsyncIterator[FakeApiServer]:
    """A started FakeApiServer, stopped on exit."""
    fake = FakeApiServer(**kw)
    await fake.start()
    try:
        yield fake
    finally:
        await fake.stop()


def served_pool(tmp_path: Path, fake: FakeApiServer, **kw: Any) -> contextlib.AbstractAsyncContextManager[Running]:
    """The service discovering the pool (``pool_name``, default qwen-pool) from ``fake`` via a kubeconfig."""
    discovery = pool_discovery(write_kubeconfig(tmp_path, fake.url), **kw)
    return running_service(tmp_path, discovery, FakeApiServer.free_port())
