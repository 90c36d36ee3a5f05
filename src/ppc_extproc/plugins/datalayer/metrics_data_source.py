"""``metrics-data-source``: poll every endpoint's ``/metrics`` and hand the body to its extractors.

Type        ``metrics-data-source`` (polling data source; wire it with ``dataLayer.sources``)
Behaviour   one task per endpoint polls ``<scheme>://<ip>:<port><path>`` every ``interval``; each
            200 body goes to the source's extractors (``core-metrics-extractor``). A semaphore bounds
            concurrent polls and each poll has a timeout, so a slow or dead engine only delays its
            own task; failing endpoints back off (doubling, up to 1 s). Endpoints follow the pool:
            added ones are polled at once, deleted ones stop and their metrics are forgotten.
Parameters  (llm-d's names and defaults)
            ``scheme`` [http|https], ``path`` ["/metrics"], ``port`` [the endpoint's port],
            ``insecureSkipVerify`` [true], ``caCertPath``, ``clientCertPath``, ``clientKeyPath`` [""],
            ``interval`` ["50ms"; rounded to a multiple of 50 ms, at least 50 ms]
            ``maxInterval`` ["1s"; ppc-extproc's own; ≤ ``interval`` polls at the fixed interval as
            llm-d does]
Adaptive    an endpoint whose load (waiting, running, KV usage as extracted) did not change since
            its last poll is polled at twice the previous interval, up to ``maxInterval``; a change
            brings it back to ``interval``, and so does this service routing a request to it or one
            finishing there (its in-flight count moved; checked every 250 ms while backed off:
            the source declares ``InFlightLoadDataKey/inflight-load-producer`` and is built with
            that producer's view, which the loader creates when it is not configured). An
            idle fleet of 100 engines is then polled 100×/s instead of 2,000×/s (BENCHMARKS.md, "What routing costs").
            Metrics go stale after 3 × ``maxInterval`` without a successful poll; scorers then treat
            them as unknown. A failing poll never makes the endpoint unroutable (in llm-d a failed
            poll only skips the extractors: ``pkg/epp/framework/plugins/datalayer/source/http/``
            ``datasource.go``, ``Dispatch``).

    plugins:
    - type: metrics-data-source
      parameters: {interval: 100ms}
    - type: core-metrics-extractor
    dataLayer:
      sources:
      - pluginRef: metrics-data-source
        extractors: [{pluginRef: core-metrics-extractor}]

Without a source in ``dataLayer.sources`` nothing is polled, unless a configured plugin reads
engine metrics and ``dataLayer.injectDefaults`` is true (then this source and the extractor are
added, as llm-d does).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Sequence

import structlog

from ppc_extproc.framework import (
    IN_FLIGHT_LOAD,
    Consumes,
    Endpoint,
    EndpointEvent,
    EndpointEventKind,
    Lifecycle,
    MetricsExtractor,
    PluginState,
    PollingSource,
    StateReporter,
    plays,
)
from ppc_extproc.framework.params import Section
from ppc_extproc.ids import EndpointId
from ppc_extproc.plugins.datalayer.metrics_fetch import Fetch, HttpFetcher
from ppc_extproc.plugins.datalayer.metrics_poll_config import BASE_TICK_SECONDS, PollOptions, poll_options
from ppc_extproc.plugins.producers.inflight_load import INFLIGHT_LOAD_PRODUCER
from ppc_extproc.plugins.registry import Services, SourceWiring, register

__all__ = ["BASE_TICK_SECONDS", "Fetch", "MetricsDataSource", "PollOptions"]

log = structlog.get_logger(__name__)


#: While backed off, how often an endpoint's in-flight count is checked for movement.
_MOVEMENT_CHECK_SECONDS = 0.25


class _Target:
    __slots__ = ("endpoint", "failures", "inflight_seen", "interval", "last_duration", "last_error", "load",
                 "moved", "polls", "task", "url")  # fmt: skip

    def __init__(self, endpoint: Endpoint, url: str) -> None:
        self.endpoint = endpoint
        self.url = url
        self.task: asyncio.Task[None] | None = None
        self.failures = 0
        self.last_error = ""
        self.polls = 0
        self.last_duration = 0.0
        #: Current polling interval (adaptive) and the load seen at the last poll.
        self.interval = 0.0
        self.load: tuple[object, ...] | None = None
        #: The last poll saw the load change.
        self.moved = True
        #: This service's in-flight count for the endpoint at the last poll.
        self.inflight_seen = -1


@register("metrics-data-source")
class MetricsDataSource(PollingSource, Lifecycle, StateReporter):
    """Polls endpoints' metrics for its extractors; see the module docstring."""

    #: Adaptive polling wakes an endpoint whose in-flight count moved: the producer's standing view.
    source_consumes: tuple[Consumes[object], ...] = (Consumes(IN_FLIGHT_LOAD, INFLIGHT_LOAD_PRODUCER),)

    def __init__(
        self,
        name: str = "metrics-data-source",
        options: PollOptions | None = None,
        *,
        extractors: Sequence[MetricsExtractor] = (),
        clock: Callable[[], float] = time.monotonic,
        fetch: Fetch | None = None,
        load: Callable[[str], tuple[object, ...] | None] | None = None,
        inflight: Callable[[str], int] | None = None,
    ) -> None:
        self.name = name
        self.options = options or PollOptions()
        #: The endpoint's load as extracted (adaptive polling compares it poll to poll).
        self._load = load
        #: This service's in-flight request count of an endpoint (routing moves the load).
        self._inflight = inflight
        self.clock = clock
        self.extractors = tuple(dict.fromkeys(extractors))
        #: None ⇒ aiohttp (a session is opened by ``start``).
        self._custom_fetch = fetch
        self._fetch: Fetch | None = None
        self._http: HttpFetcher | None = None
        self._targets: dict[str, _Target] = {}
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._semaphore: asyncio.Semaphore | None = None
        self.poll_errors = 0
        self.extract_errors = 0

    @classmethod
    def from_wiring(cls, name: str, params: Section, services: Services, wiring: SourceWiring) -> MetricsDataSource:
        options = poll_options(params)
        services.engine_metrics.expect_updates_every(options.interval_seconds)
        if options.max_interval_seconds is not None:
            services.engine_metrics.expect_updates_every(options.max_interval_seconds, polls=3)
        store, view = services.engine_metrics, wiring.in_flight

        def load(endpoint_id: str) -> tuple[object, ...] | None:
            metrics = store.snapshot(endpoint_id)
            return None if metrics is None else (metrics.waiting, metrics.running, metrics.kv_usage)

        extractors = [e for e in wiring.extractors if plays(e, MetricsExtractor)]
        inflight = None if view is None else (lambda endpoint_id: view.requests(EndpointId(endpoint_id)))
        return cls(name, options, extractors=extractors, clock=services.clock, load=load, inflight=inflight)

    # --- wiring ---------------------------------------------------------------------------------

    def on_endpoint_event(self, event: EndpointEvent) -> None:
        """Pool listener; safe from any thread (hands over to the loop once started)."""
        loop = self._loop
        if loop is None or self._loop_thread == threading.get_ident():
            self._apply(event)
        elif not loop.is_closed():
            loop.call_soon_threadsafe(self._apply, event)

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
        if target is not None:
            self._cancel(target)
        for extractor in self.extractors:
            extractor.forget_endpoint(endpoint_id)

    @staticmethod
    def _cancel(target: _Target) -> None:
        if target.task is not None:
            target.task.cancel()
            target.task = None

    def _launch(self, target: _Target) -> None:
        if self._fetch is not None and self._loop is not None and target.task is None:
            target.task = self._loop.create_task(self._run(target), name=f"metrics-poll:{target.endpoint.id}")

    # --- lifecycle ------------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._fetch is not None

    async def start(self) -> None:
        """Start polling on the running loop (idempotent)."""
        if self._fetch is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._semaphore = asyncio.Semaphore(self.options.max_concurrency)
        if self._custom_fetch is not None:
            self._fetch = self._custom_fetch
        else:
            self._http = self._fetch = HttpFetcher(self.options)
        with self._lock:
            targets = list(self._targets.values())
        for target in targets:
            self._launch(target)
        log.info("metrics_source_started", source=self.name, endpoints=len(targets),
                 interval_seconds=self.options.interval_seconds)  # fmt: skip

    async def stop(self) -> None:
        """Cancel every poll and close the HTTP session."""
        http, self._http, self._fetch = self._http, None, None
        with self._lock:
            tasks = [t.task for t in self._targets.values() if t.task is not None]
            for target in self._targets.values():
                target.task = None
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if http is not None:
            await http.close()
        self._loop = None
        self._loop_thread = None

    # --- polling --------------------------------------------------------------------------------

    @property
    def adaptive(self) -> bool:
        limit = self.options.max_interval_seconds
        return limit is not None and limit > self.options.interval_seconds

    async def _run(self, target: _Target) -> None:
        loop = asyncio.get_running_loop()
        base = self.options.interval_seconds
        adaptive = self.adaptive
        interval = base
        next_at = loop.time()
        expedited = False
        while True:
            ok = await self.poll(target.endpoint.id)
            if ok:
                if adaptive:
                    limit = self.options.max_interval_seconds or base
                    interval = base if target.moved or expedited else min(limit, interval * 2)
                next_at += interval
            else:  # back off: interval × 2^failures, capped
                interval = base
                delay = min(self.options.max_backoff_seconds, base * 2 ** min(target.failures, 16))
                next_at = loop.time() + delay
            target.interval = interval
            expedited = False
            if adaptive and interval > base:
                expedited = await self._sleep_unless_moved(target, next_at)
            else:
                await asyncio.sleep(max(0.0, next_at - loop.time()))
            # Fell behind (slow engine) or woke early: the next poll is now, and no catch-up burst.
            next_at = loop.time() if expedited else max(next_at, loop.time())

    async def _sleep_unless_moved(self, target: _Target, until: float) -> bool:
        """Sleep until ``until``; True when woken early because this service's in-flight count for
        the endpoint differs from the one at its last poll (routing has moved its load)."""
        loop = asyncio.get_running_loop()
        while (remaining := until - loop.time()) > 0:
            await asyncio.sleep(min(remaining, _MOVEMENT_CHECK_SECONDS))
            if self._inflight is not None and self._inflight(target.endpoint.id) != target.inflight_seen:
                return True
        return False

    async def poll(self, endpoint_id: str) -> bool:
        """Poll one endpoint now and feed the extractors. True when some extractor took the body."""
        target = self._targets.get(endpoint_id)
        fetch, semaphore = self._fetch, self._semaphore
        if target is None or fetch is None or semaphore is None:
            return False
        async with semaphore:
            started = time.perf_counter()
            try:
                async with asyncio.timeout(self.options.timeout_seconds):
                    body = await fetch(target.url)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.poll_errors += 1
                self._failed(target, exc)
                return False
            finally:
                target.last_duration = time.perf_counter() - started
        if self._targets.get(endpoint_id) is not target:  # deleted or replaced meanwhile
            return False
        now = self.clock()
        if self._inflight is not None:
            target.inflight_seen = self._inflight(endpoint_id)
        accepted = 0
        error: Exception | None = None
        for extractor in self.extractors:
            try:
                extractor.extract_metrics(target.endpoint, body, now)
                accepted += 1
            except ValueError as exc:
                self.extract_errors += 1
                error = exc
        if self.extractors and not accepted:
            self._failed(target, error or ValueError("no extractor accepted the body"))
            return False
        if self._load is not None:
            load = self._load(endpoint_id)
            target.moved, target.load = load != target.load, load
        target.polls += 1
        if target.failures:
            log.info("metrics_poll_recovered", endpoint=endpoint_id, failures=target.failures)
        target.failures = 0
        return True

    def _failed(self, target: _Target, exc: Exception) -> None:
        error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        if target.failures == 0:
            log.warning("metrics_poll_failed", endpoint=target.endpoint.id, url=target.url, error=error)
        target.failures += 1
        target.last_error = error

    # --- state ----------------------------------------------------------------------------------

    def state(self, *, detailed: bool = False) -> PluginState:
        endpoints = {
            endpoint_id: {
                "url": target.url,
                "polls": target.polls,
                "consecutiveFailures": target.failures,
                "lastError": target.last_error or None,
                "lastPollSeconds": round(target.last_duration, 6),
                "intervalSeconds": round(target.interval, 3),
            }
            for endpoint_id, target in list(self._targets.items())
        }
        return PluginState(
            self.name, self.type_name,
            details={
                "intervalSeconds": self.options.interval_seconds,
                "maxIntervalSeconds": self.options.max_interval_seconds,
                "extractors": [e.name for e in self.extractors],
                "pollErrors": self.poll_errors,
                "extractErrors": self.extract_errors,
                "endpoints": endpoints,
            },
        )
