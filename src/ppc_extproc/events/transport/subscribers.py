"""The subscribers of the ingestion thread: SUB sockets per endpoint (or one central SUB), their
connection monitors, and reading messages off them into the ingestor.

Per-endpoint mode: one SUB per endpoint connected to ``tcp://<ip>:<socket_port + rank>``; events
are attributed to the endpoint's ``ip:port`` and the model comes from the topic (as llm-d does,
``llm-d/llm-d-router: pkg/kvevents/subscriber_manager.go``). Central mode: one SUB bound at
``zmq_endpoint``; the source is the topic's pod id (``kv@<ip:port>@<model>``), and only pool
endpoints are sources: anyone who can reach the port can publish, so a topic naming anything else
is counted (``unknown``/``topic_not_in_pool``) and dropped without keeping any state for it. A
source lives as long as its endpoint is in the pool (``add``/``remove``, which the producer calls
on discovery events in both modes), so the source table, the per-source counters and their metric
labels are bounded by the pool. Frames are checked before anything else: a message that is not
three frames with an 8-byte sequence number never reaches a source. Ingestion thread only.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, cast

import structlog
import zmq

from ppc_extproc.events.config import KVEventsConfig
from ppc_extproc.events.stats import IngestStats
from ppc_extproc.events.transport.curve import ZAP_DOMAIN, CurveKeys, ZapHandler
from ppc_extproc.events.transport.frames import parse_topic, split_message, tcp_address
from ppc_extproc.events.transport.ingest import Ingestor
from ppc_extproc.events.transport.policy import TransportTuning
from ppc_extproc.events.transport.ratelimit import RateLimitedLog
from ppc_extproc.events.transport.reactor import Reactor
from ppc_extproc.events.transport.sockets import (
    HANDSHAKE_FAILED_EVENTS,
    close_socket,
    open_sub,
    read_message,
    recv_monitor_event,
)
from ppc_extproc.events.transport.source import Source

if TYPE_CHECKING:
    from ppc_extproc.events.transport.source import EventEndpoint

__all__ = ["UNATTRIBUTED", "Subscribers"]

log = structlog.get_logger(__name__)

#: Endpoint label of counters that cannot be attributed (central mode: bad frames, bad topics).
UNATTRIBUTED = "unknown"
#: Characters of a foreign pod id quoted in a (rate-limited) warning.
_LOGGED_POD_ID_CHARS = 120


def _has_input(sock: zmq.Socket[bytes]) -> bool:
    return bool(cast(int, sock.getsockopt(zmq.EVENTS)) & zmq.POLLIN)


class Subscribers:
    """Sources and their sockets; every method runs on the ingestion thread."""

    def __init__(
        self,
        context: zmq.Context[zmq.Socket[bytes]],
        reactor: Reactor,
        ingest: Ingestor,
        config: KVEventsConfig,
        stats: IngestStats,
        tuning: TransportTuning,
        warn: RateLimitedLog,
        curve: CurveKeys | None = None,
    ) -> None:
        self._context = context
        self._curve = curve
        self._zap: ZapHandler | None = None
        self._central_monitor: zmq.Socket[bytes] | None = None
        self._reactor = reactor
        self._ingest = ingest
        self.config = config
        self.stats = stats
        self.tuning = tuning
        self._warn = warn
        self.central = bool(config.zmq_endpoint)
        self._topic_filter = config.topic_filter.encode()
        self.sources: dict[str, Source] = {}
        self._central_sub: zmq.Socket[bytes] | None = None
        self._central_retry_at = 0.0
        self._central_backoff = 0.0
        self._central_topics: dict[bytes, Source] = {}
        #: Central mode: the pool's endpoint ids, the only pod ids accepted from topics.
        self._pool: set[str] = set()
        #: Messages read from the SUB sockets so far, and their payloads' bytes (the loop's
        #: ``StreamDensity``).
        self.read = 0
        self.read_bytes = 0

    def busy(self) -> bool:
        """Some source holds messages for after its replay."""
        return any(src.held for src in self.sources.values())

    def tick(self, now: float) -> None:
        """Retry sockets whose creation failed (a failure that sets a retry tells the reactor)."""
        reactor = self._reactor
        if self.central and self._central_sub is None:
            if now >= self._central_retry_at:
                self.open_central()
            else:
                reactor.timer_at(self._central_retry_at)
        for src in list(self.sources.values()):
            if src.sub is None and src.address:
                if now >= src.retry_at:
                    self._open_source(src)
                else:
                    reactor.timer_at(src.retry_at)

    def close_all(self) -> None:
        for src in self.sources.values():
            self._unregister(src)
            close_socket(src.sub, src.monitor)
            src.sub = src.monitor = None
            src.state.connected = False
        if self._central_sub is not None:
            self._reactor.remove(self._central_sub)
            if self._central_monitor is not None:
                self._reactor.remove(self._central_monitor)
            close_socket(self._central_sub, self._central_monitor)
            self._central_sub = self._central_monitor = None
        if self._zap is not None:
            self._reactor.remove(self._zap.sock)
            self._zap.close()
            self._zap = None

    # --- endpoints -----------------------------------------------------------------------------

    def add(self, endpoint: EventEndpoint) -> None:
        if self.central:
            self._pool.add(endpoint.id)
            return
        ports = self.config.pod_discovery
        address = tcp_address(endpoint.address, ports.socket_port + endpoint.rank)
        replay_address = ""
        if ports.replay_socket_port > 0:
            replay_address = tcp_address(endpoint.address, ports.replay_socket_port + endpoint.rank)
        src = self.sources.get(endpoint.id)
        if src is not None:
            if src.address == address and src.replay_address == replay_address:
                return
            log.info("kv_subscriber_recreated", endpoint=endpoint.id, address=address)
            self._unregister(src)
            close_socket(src.sub, src.monitor)
            self._ingest.reset(src)
        state = self.stats.source(endpoint.id)
        state.address = address
        self.stats.set_connected(state, False)
        src = Source(endpoint.id, state, address, replay_address)
        self.sources[endpoint.id] = src
        self._ingest.adopt(src)
        self._open_source(src)

    def remove(self, endpoint: EventEndpoint) -> None:
        src = self.sources.pop(endpoint.id, None)
        if self.central:
            self._pool.discard(endpoint.id)
            for topic in [t for t, s in self._central_topics.items() if s is src]:
                del self._central_topics[topic]
        if src is None:
            self._ingest.applier.remove_endpoint(endpoint.id)
            return
        self._unregister(src)
        close_socket(src.sub, src.monitor)
        src.sub = src.monitor = None
        self._ingest.forget(src)
        log.info("kv_subscriber_removed", endpoint=endpoint.id)

    def _unregister(self, src: Source) -> None:
        for sock in (src.sub, src.monitor):
            if sock is not None:
                self._reactor.remove(sock)

    def _open_source(self, src: Source) -> None:
        try:
            sub, monitor = open_sub(
                self._context,
                src.address,
                bind=False,
                topic_filter=self._topic_filter,
                hwm=self.config.queue_size,
                tuning=self.tuning,
                monitor=True,
            )
        except zmq.ZMQError as exc:
            self._socket_error(src, exc)
            return
        assert monitor is not None
        src.sub, src.monitor, src.backoff = sub, monitor, 0.0
        self._reactor.add(sub, lambda: self._drain_sub(src))
        self._reactor.add(monitor, lambda: self._drain_monitor(src), priority=True)

    def _socket_error(self, src: Source, exc: zmq.ZMQError) -> None:
        t = self.tuning
        src.backoff = min(max(src.backoff * 2, t.reconnect_interval_seconds), t.reconnect_interval_max_seconds)
        src.retry_at = time.monotonic() + src.backoff
        self._reactor.timer_at(src.retry_at)
        self.stats.count(src.endpoint, "socket_errors")
        self._warn.warning("kv_subscriber_socket_error", src.endpoint, address=src.address, error=str(exc))

    def open_central(self) -> None:
        curve = self._curve
        if curve is not None and self._zap is None:
            self._zap = ZapHandler(self._context, curve.allowed)  # bound before the CURVE server
            self._reactor.add(self._zap.sock, self._drain_zap, priority=True)
        try:
            sub, monitor = open_sub(
                self._context,
                self.config.zmq_endpoint,
                bind=True,
                topic_filter=self._topic_filter,
                hwm=self.config.queue_size,
                tuning=self.tuning,
                monitor=curve is not None,
                monitor_events=HANDSHAKE_FAILED_EVENTS | zmq.EVENT_HANDSHAKE_SUCCEEDED,
                curve_secret_key=curve.server_secret if curve is not None else None,
                zap_domain=ZAP_DOMAIN,
            )
        except zmq.ZMQError as exc:
            t = self.tuning
            self._central_backoff = min(
                max(self._central_backoff * 2, t.reconnect_interval_seconds),
                t.reconnect_interval_max_seconds,
            )
            self._central_retry_at = time.monotonic() + self._central_backoff
            self._reactor.timer_at(self._central_retry_at)
            self.stats.count(UNATTRIBUTED, "socket_errors")
            self._warn.warning(
                "kv_central_bind_failed",
                UNATTRIBUTED,
                address=self.config.zmq_endpoint,
                error=str(exc),
            )
            return
        self._central_sub = sub
        self._reactor.add(sub, self._drain_central)
        if monitor is not None:
            self._central_monitor = monitor
            self._reactor.add(monitor, self._drain_central_monitor, priority=True)
        log.info("kv_central_subscriber_bound", address=self.config.zmq_endpoint, curve=curve is not None)

    def _drain_zap(self) -> bool:
        zap = self._zap
        if zap is None:
            return False
        refused = zap.refused
        more = zap.drain()
        if zap.refused > refused:
            self.stats.count(UNATTRIBUTED, "publishers_refused", zap.refused - refused)
            self._warn.warning("kv_publisher_refused", UNATTRIBUTED, reason="curve_key_not_allowed")
        return more

    def _drain_central_monitor(self) -> bool:
        monitor = self._central_monitor
        while monitor is not None:
            event = recv_monitor_event(monitor)
            if event is None:
                break
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self.stats.count(UNATTRIBUTED, "publisher_handshakes")
            else:
                self.stats.count(UNATTRIBUTED, "handshakes_failed")
                self._warn.warning("kv_publisher_handshake_failed", UNATTRIBUTED, monitor_event=event)
        return False

    # --- reading -------------------------------------------------------------------------------

    def _drain_monitor(self, src: Source) -> bool:
        monitor = src.monitor
        while monitor is not None and src.monitor is monitor:
            event = recv_monitor_event(monitor)
            if event is None:
                break
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self._ingest.connected(src)
            elif event == zmq.EVENT_DISCONNECTED:
                self._ingest.disconnected(src)
        return False

    def _drain_sub(self, src: Source) -> bool:
        """Read up to ``drain_budget`` messages; True when the budget ran out first."""
        sub = src.sub
        if sub is None:
            return False
        recv = sub.recv
        live = self._ingest.live
        count = self.stats.count
        endpoint = src.endpoint
        for i in range(self.tuning.drain_budget):
            if i == 1 and not _has_input(sub):
                return False  # the usual single message: cheaper than a failed recv
            try:
                first = recv(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return False
            try:
                message = split_message(read_message(recv, first))
                if isinstance(message, str):
                    count(endpoint, message)
                    self._warn.warning("kv_" + message, endpoint)
                    continue
                count(endpoint, "messages")
                self.read += 1
                self.read_bytes += len(message[2])
                live(src, *message)
            except Exception:  # the loop boundary: log, count, continue
                count(endpoint, "internal_errors")
                log.exception("kv_message_failed", endpoint=endpoint)
            if src.sub is not sub:
                return False
        return True

    def _drain_central(self) -> bool:
        """Read up to ``drain_budget`` messages; True when the budget ran out first."""
        sub = self._central_sub
        if sub is None:
            return False
        recv = sub.recv
        live = self._ingest.live
        count = self.stats.count
        topics = self._central_topics
        for i in range(self.tuning.drain_budget):
            if i == 1 and not _has_input(sub):
                return False
            try:
                first = recv(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return False
            try:
                frames = read_message(recv, first)
                message = split_message(frames)
                if isinstance(message, str):  # checked before the topic can create a source
                    known = topics.get(frames[0])
                    endpoint = known.endpoint if known is not None else UNATTRIBUTED
                    count(endpoint, message)
                    self._warn.warning("kv_" + message, endpoint)
                    continue
                topic = message[0]
                src = topics.get(topic) or self._central_source(topic)
                if src is None:
                    continue
                count(src.endpoint, "messages")
                self.read += 1
                self.read_bytes += len(message[2])
                live(src, *message)
            except Exception:  # the loop boundary: log, count, continue
                count(UNATTRIBUTED, "internal_errors")
                log.exception("kv_message_failed")
        return True

    def _central_source(self, topic: bytes) -> Source | None:
        """The source of a topic not seen before; None (counted, no state kept) when it names no
        pool endpoint."""
        parsed = parse_topic(topic)
        if parsed is None:
            self.stats.count(UNATTRIBUTED, "bad_topic")
            self._warn.warning("kv_bad_topic", UNATTRIBUTED, topic=topic[:200].hex())
            return None
        pod = parsed.pod_id
        if pod not in self._pool:
            self.stats.count(UNATTRIBUTED, "topic_not_in_pool")
            self._warn.warning("kv_topic_not_in_pool", UNATTRIBUTED, pod_id=pod[:_LOGGED_POD_ID_CHARS])
            return None
        src = self.sources.get(pod)
        if src is None:
            state = self.stats.source(pod)
            state.address = self.config.zmq_endpoint
            state.connected = True
            src = self.sources[pod] = Source(pod, state)
            self._ingest.adopt(src)
        if len(self._central_topics) < self.tuning.max_central_sources:
            self._central_topics[topic] = src
        return src
