"""``EngineMetricsSource``: scrape every endpoint's vLLM ``/metrics`` on an interval.

    source = services.engine_metrics_source()   # one per process, shared by the scorers
    source.attach(pool)                         # follow endpoint add / update / delete
    await source.start()                        # on the running loop (grpc.aio + aiohttp admin)
    ...
    source.snapshot("10.0.0.1:8000")            # request path: a dict lookup, never I/O
    await source.stop()

One task per endpoint scrapes, parses (``parse.py``) and swaps in a fresh ``EngineMetrics``; a
semaphore bounds concurrent scrapes and each scrape has a timeout, so a slow or dead engine only
delays its own task. Failing endpoints back off (doubling, up to ``max_backoff_seconds``). A
snapshot older than ``stale_after_intervals × interval_seconds`` is returned with ``stale=True``.
A 200 response without any of the vLLM gauges counts as a failure (wrong port, not vLLM).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

import aiohttp
import structlog

from ppc_extproc.enginemetrics.parse import parse_vllm_metrics
from ppc_extproc.enginemetrics.types import EngineMetrics
from ppc_extproc.scheduling.pool import EndpointPool
from ppc_extproc.scheduling.types import Endpoint, EndpointEvent, EndpointEventKind

__all__ = ["EngineMetricsOptions", "EngineMetricsSource", "Fetch"]

#: ``await fetch(url)`` → the body of a 200 response; raises on anything else. The test seam.
Fetch = Callable[[str], Awaitable[bytes]]

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class EngineMetricsOptions:
    """How the source scrapes (llm-d: ``--refresh-metrics-interval`` 50 ms)."""

    interval_seconds: float = 0.05
    #: Per scrape, connect to end of body.
    timeout_seconds: float = 0.5
    #: No successful scrape for this many intervals ⇒ stale (20 × 50 ms = 1 s).
    stale_after_intervals: int = 20
    #: Scrapes in flight at once, over all endpoints.
    max_concurrency: int = 16
    #: Upper bound of the retry delay of a failing endpoint.
    max_backoff_seconds: float = 1.0
    scheme: str = "http"
    path: str = "/metrics"
    #: None ⇒ the endpoint's own port (vLLM serves /metrics next to the API).
    port: int | None = None
    #: Larger bodies are a failure.
    max_body_bytes: int = 16 * 1024 * 1024

    def __post_init__(self) -> None:
        for name in ("interval_seconds", "timeout_seconds", "max_backoff_seconds"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0")
        if self.stale_after_intervals < 1 or self.max_concurrency < 1:
            raise ValueError("stale_after_intervals and max_concurrency must be >= 1")

    @property
    def stale_after_seconds(self) -> float:
        return self.stale_after_intervals * self.interval_seconds


class _Target:
    __slots__ = ("endpoint", "failures", "last_duration", "last_error", "scrapes", "task", "url")

    def __init__(self, endpoint: Endpoint, url: str) -> None:
        self.endpoint = endpoint
        self.url = url
        self.task: asyncio.Task[None] | None = None
        self.failures = 0
        self.last_error = ""
        self.scrapes = 0
        self.last_duration = 0.0


class EngineMetricsSource:
    """Latest ``EngineMetrics`` per endpoint id, kept fresh by background scrapes."""

    def __init__(
        self,
        options: EngineMetricsOptions | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        fetch: Fetch | None = None,
    ) -> None:
        self.options = options or EngineMetricsOptions()
        self.clock = clock
        #: None ⇒ aiohttp (a session is opened by ``start``).
        self._custom_fetch = fetch
        self._fetch: Fetch | None = None
        self._stale_after = self.options.stale_after_seconds
        self._snapshots: dict[str, EngineMetrics] = {}
        #: Stale copies handed out, so a dead engine costs a dict lookup too.
        self._stale: dict[str, EngineMetrics] = {}
        self._targets: dict[str, _Target] = {}
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._session: aiohttp.ClientSession | None = None
        self._semaphore: asyncio.Semaphore | None = None
        self._attached = False

    # --- request path ---------------------------------------------------------------------------

    def snapshot(self, endpoint_id: str) -> EngineMetrics | None:
        """Latest metrics of ``endpoint_id``; None before its first successful scrape."""
        metrics = self._snapshots.get(endpoint_id)
        if metrics is None or self.clock() - metrics.updated_at <= self._stale_after:
            return metrics
        stale = self._stale.get(endpoint_id)
        if stale is None or stale.updated_at != metrics.updated_at:
            stale = self._stale[endpoint_id] = replace(metrics, stale=True)
        return stale

    def snapshots(self) -> dict[str, EngineMetrics]:
        return {ep: m for ep in list(self._snapshots) if (m := self.snapshot(ep)) is not None}

    # --- endpoints ------------------------------------------------------------------------------

    def attach(self, pool: EndpointPool) -> None:
        """Follow the pool: scrape its endpoints (current ones at once) until they are deleted."""
        self._attached = True
        pool.subscribe(self.on_endpoint_event)

    def on_endpoint_event(self, event: EndpointEvent) -> None:
        """Pool listener; safe from any thread (hands over to the loop once started)."""
        loop = self._loop
        if loop is None or self._loop_thread == threading.get_ident():
            self._apply(event)
        elif not loop.is_closed():
            loop.call_soon_threadsafe(self._apply, event)

    def add_endpoint(self, endpoint: Endpoint) -> None:
        self.on_endpoint_event(EndpointEvent(EndpointEventKind.ADDED, endpoint))

    def remove_endpoint(self, endpoint: Endpoint) -> None:
        self.on_endpoint_event(EndpointEvent(EndpointEventKind.DELETED, endpoint))

    def endpoints(self) -> list[str]:
        return list(self._targets)

    def _url(self, endpoint: Endpoint) -> str:
        host = endpoint.address.strip("[]")
        if ":" in host:
            host = f"[{host}]"
        port = self.options.port or endpoint.port
        return f"{self.options.scheme}://{host}:{port}{self.options.path}"

    def _apply(self, event: EndpointEvent) -> None:
        endpoint = event.endpoint
        if event.kind is EndpointEventKind.DELETED:
            self._drop(endpoint.id)
            return
        if event.previous is not None and event.previous.id != endpoint.id:
            self._drop(event.previous.id)
        url = self._url(endpoint)
        with self._lock:
            target = self._targets.get(endpoint.id)
            if target is not None and target.url == url:
                target.endpoint = endpoint
                return
            if target is not None:
                self._cancel(target)
            target = self._targets[endpoint.id] = _Target(endpoint, url)
        self._launch(target)

    def _drop(self, endpoint_id: str) -> None:
        with self._lock:
            target = self._targets.pop(endpoint_id, None)
            self._snapshots.pop(endpoint_id, None)
            self._stale.pop(endpoint_id, None)
        if target is not None:
            self._cancel(target)

    @staticmethod
    def _cancel(target: _Target) -> None:
        if target.task is not None:
            target.task.cancel()
            target.task = None

    def _launch(self, target: _Target) -> None:
        if self._fetch is not None and self._loop is not None and target.task is None:
            target.task = self._loop.create_task(
                self._run(target), name=f"engine-metrics:{target.endpoint.id}"
            )

    # --- lifecycle ------------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._fetch is not None

    async def start(self) -> None:
        """Start scraping on the running loop (idempotent)."""
        if self._fetch is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._semaphore = asyncio.Semaphore(self.options.max_concurrency)
        if self._custom_fetch is not None:
            self._fetch = self._custom_fetch
        else:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self.options.max_concurrency, ttl_dns_cache=60),
                headers={"Accept": "text/plain;version=0.0.4", "Accept-Encoding": "identity"},
                cookie_jar=aiohttp.DummyCookieJar(),
            )
            self._fetch = self._http_get
        with self._lock:
            targets = list(self._targets.values())
        for target in targets:
            self._launch(target)
        if not targets and not self._attached:
            log.warning("engine_metrics_without_endpoints", hint="call attach(pool) before start()")
        log.info(
            "engine_metrics_started",
            endpoints=len(targets),
            interval_seconds=self.options.interval_seconds,
            timeout_seconds=self.options.timeout_seconds,
        )

    async def stop(self) -> None:
        """Cancel every scrape and close the HTTP session. Snapshots stay readable."""
        session, self._session, self._fetch = self._session, None, None
        with self._lock:
            tasks = [t.task for t in self._targets.values() if t.task is not None]
            for target in self._targets.values():
                target.task = None
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if session is not None:
            await session.close()
        self._loop = None
        self._loop_thread = None

    # --- scraping -------------------------------------------------------------------------------

    async def _run(self, target: _Target) -> None:
        loop = asyncio.get_running_loop()
        interval = self.options.interval_seconds
        next_at = loop.time()
        while True:
            ok = await self.scrape(target.endpoint.id)
            if ok:
                next_at += interval
            else:  # back off: interval × 2^failures, capped
                delay = min(self.options.max_backoff_seconds, interval * 2 ** min(target.failures, 16))
                next_at = loop.time() + delay
            await asyncio.sleep(max(0.0, next_at - loop.time()))
            next_at = max(next_at, loop.time())  # fell behind (slow engine): no catch-up burst

    async def scrape(self, endpoint_id: str) -> bool:
        """Scrape one endpoint now and store the result. True on success."""
        target = self._targets.get(endpoint_id)
        fetch, semaphore = self._fetch, self._semaphore
        if target is None or fetch is None or semaphore is None:
            return False
        async with semaphore:
            started = time.perf_counter()
            try:
                async with asyncio.timeout(self.options.timeout_seconds):
                    body = await fetch(target.url)
                metrics = parse_vllm_metrics(body, self.clock())
                if metrics.waiting is None and metrics.running is None and metrics.kv_usage is None:
                    raise ValueError("no vLLM gauges in the response")
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._failed(target, exc)
                return False
            finally:
                target.last_duration = time.perf_counter() - started
        if self._targets.get(endpoint_id) is not target:  # deleted or replaced meanwhile
            return False
        self._snapshots[endpoint_id] = metrics
        target.scrapes += 1
        if target.failures:
            log.info("engine_metrics_scrape_recovered", endpoint=endpoint_id, failures=target.failures)
        target.failures = 0
        return True

    async def _http_get(self, url: str) -> bytes:
        session = self._session
        if session is None:
            raise RuntimeError("engine metrics source is stopped")
        async with session.get(url, allow_redirects=False) as response:
            if response.status != 200:
                raise ValueError(f"HTTP {response.status}")
            if (response.content_length or 0) > self.options.max_body_bytes:
                raise ValueError(f"body of {response.content_length} bytes is too large")
            body = await response.read()
            if len(body) > self.options.max_body_bytes:
                raise ValueError(f"body of {len(body)} bytes is too large")
            return body

    def _failed(self, target: _Target, exc: Exception) -> None:
        error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        if target.failures == 0:
            log.warning("engine_metrics_scrape_failed", endpoint=target.endpoint.id, url=target.url, error=error)
        target.failures += 1
        target.last_error = error

    # --- debugging ------------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """Per endpoint: the snapshot, its age, and scrape health (for the admin API)."""
        now = self.clock()
        out: dict[str, Any] = {}
        for endpoint_id, target in list(self._targets.items()):
            metrics = self.snapshot(endpoint_id)
            out[endpoint_id] = {
                "url": target.url,
                "scrapes": target.scrapes,
                "consecutiveFailures": target.failures,
                "lastError": target.last_error or None,
                "lastScrapeSeconds": round(target.last_duration, 6),
                "ageSeconds": None if metrics is None else round(now - metrics.updated_at, 3),
                "stale": None if metrics is None else metrics.stale,
                "waiting": None if metrics is None else metrics.waiting,
                "running": None if metrics is None else metrics.running,
                "kvUsage": None if metrics is None else metrics.kv_usage,
                "blockSize": None if metrics is None else metrics.block_size,
                "numGpuBlocks": None if metrics is None else metrics.num_gpu_blocks,
            }
        return out
