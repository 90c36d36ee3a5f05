"""``ZmqTransport``: ZMQ subscribers feeding the applier on one background ingestion thread.

Threading: the thread owns every socket, the applier and the sources; other threads talk to it
through a command queue plus an inproc PAIR wake-up (``add_endpoint``, ``remove_endpoint``,
``wait_idle``, ``stop``, ``flush``). The request path reads the (thread-safe) index; it waits on
the thread only after a ``flush``, at most ``flush_wait_seconds``. Each round waits on the
sockets' notification descriptors (``Reactor``), drains each socket with input for at most
``drain_budget`` messages (one busy publisher cannot starve the others), then, while messages
come closer together than ``batch_window_seconds``, fewer than ``dense_messages_per_second`` and
no larger than ``small_message_bytes``, lets the next ones gather for that long (the sparse
messages of many decoding streams then share wake-ups; a command, a connection event or an
arriving request (``flush``) ends the pause at once; a denser stream, or one of prompts' prefill
blocks, is read as it comes). Timers (replay deadlines, socket retries) run when the earliest is
due (an idle thread sleeps in the selector, waking at most once per ``poll_interval_seconds``).
Events of one source are decoded and applied in sequence order, inline: a second queue and thread
would only add hand-offs under the GIL. Queues are bounded by the SUB receive high-water mark per
connection (``queue_size``; overflow shows up as a sequence gap) and, during a replay, by the hold
of that source (``queue_size``; overflow ⇒ resync by replay).

Modes: central (``zmq_endpoint`` set: one bound SUB, the source is the topic's pod id, which
must be an endpoint of the pool: ``add_endpoint``/``remove_endpoint`` maintain that set) and
per-endpoint (``discover_pods``: one SUB per endpoint at ``socket_port + rank``, the source is the
endpoint's ``ip:port``, replay at ``replay_socket_port + rank``). Each per-endpoint SUB has a
connection monitor: a reconnect is verified by replay when the endpoint has one (``Ingestor``).
"""

from __future__ import annotations

import copy
import itertools
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import structlog
import zmq

from ppc_extproc.events.apply import EventApplier
from ppc_extproc.events.config import KVEventsConfig
from ppc_extproc.events.stats import IngestStats, SourceState
from ppc_extproc.events.transport.curve import CurveKeys, central_curve_keys
from ppc_extproc.events.transport.ingest import Ingestor
from ppc_extproc.events.transport.policy import StreamDensity, TransportTuning
from ppc_extproc.events.transport.ratelimit import RateLimitedLog
from ppc_extproc.events.transport.reactor import Reactor
from ppc_extproc.events.transport.replay import ReplayManager
from ppc_extproc.events.transport.sockets import close_socket
from ppc_extproc.events.transport.subscribers import UNATTRIBUTED, Subscribers

if TYPE_CHECKING:
    from ppc_extproc.events.transport.restore import RestoreTable
    from ppc_extproc.events.transport.source import EventEndpoint, Source

__all__ = ["ZmqTransport"]

log = structlog.get_logger(__name__)
_wake_ids = itertools.count()


@dataclass(frozen=True, slots=True)
class _Command:
    kind: str  # "add" | "remove" | "barrier" | "call"
    endpoint: EventEndpoint | None = None
    done: Future[None] | None = None
    idle: threading.Event | None = None
    call: Callable[[list[Source]], Any] | None = None
    result: Future[Any] | None = None


class ZmqTransport:
    """Subscribes to engines' KV events over ZMQ; see the module docstring."""

    def __init__(
        self,
        config: KVEventsConfig,
        applier: EventApplier,
        stats: IngestStats,
        tuning: TransportTuning | None = None,
    ) -> None:
        self.config = config
        self.applier = applier
        self.stats = stats
        self.tuning = tuning or TransportTuning()
        self.central = bool(config.zmq_endpoint)
        self._commands: queue.SimpleQueue[_Command] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._context: zmq.Context[zmq.Socket[bytes]] | None = None
        self._wake_tx: zmq.Socket[bytes] | None = None
        self._wake_rx: zmq.Socket[bytes] | None = None
        self._wake_lock = threading.Lock()
        self._stopping = threading.Event()
        #: Set (under ``_wake_lock``) when the thread has finished: commands then run inline.
        self._closed = False
        # Everything below belongs to the ingestion thread.
        self._warn = RateLimitedLog(log, self.tuning.log_interval_seconds)
        self._ingest = Ingestor(
            applier,
            stats,
            engine_type=config.engine_type,
            queue_size=config.queue_size,
            warn=self._warn,
        )
        self._reactor = Reactor()
        #: Batch-window pauses taken; pauses a priority socket ended early (a command, a connection
        #: event, a flush); flushes requested by arriving requests (diagnostics).
        self.pauses = 0
        self.pauses_cut = 0
        self.flushes = 0
        #: When the running batch-window pause began (monotonic); 0.0: none runs.
        self._paused_at = 0.0
        #: Clear from a flush until the thread's next round has read what the pause gathered.
        self._drained = threading.Event()
        self._drained.set()
        self._subscribers: Subscribers | None = None
        self._barriers: list[threading.Event] = []
        self._curve: CurveKeys | None = None

    # --- public API (any thread) ---------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """Start the ingestion thread (idempotent)."""
        if self._thread is not None:
            return
        if self.central:
            self._curve = central_curve_keys(self.config)  # ConfigError before anything starts
        self._context = zmq.Context()
        address = f"inproc://ppc-kv-wake-{next(_wake_ids)}"
        self._wake_rx = self._context.socket(zmq.PAIR)
        self._wake_rx.bind(address)
        self._wake_tx = self._context.socket(zmq.PAIR)
        self._wake_tx.connect(address)
        self._thread = threading.Thread(target=self._run, name="kv-events-ingest", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread within ``timeout`` seconds; every socket is closed with linger 0."""
        if self._thread is None or self._stopping.is_set():
            return
        self._stopping.set()
        with self._wake_lock:
            if self._wake_tx is not None:
                try:
                    self._wake_tx.send(b"", zmq.NOBLOCK)
                except zmq.ZMQError:
                    pass
                self._wake_tx.close(0)
                self._wake_tx = None
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("kv_transport_stop_timeout", timeout_seconds=timeout)

    def add_endpoint(self, endpoint: EventEndpoint) -> Future[None]:
        """Ensure a subscriber for ``endpoint`` (idempotent; a changed address re-creates it). In
        central mode: accept the topics that name it from now on."""
        return self._submit("add", endpoint)

    def remove_endpoint(self, endpoint: EventEndpoint) -> Future[None]:
        """Close ``endpoint``'s subscriber, discard what is queued for it, then forget its index
        entries — in that order, on the ingestion thread (directly once it has stopped)."""
        return self._submit("remove", endpoint)

    def wait_idle(self, timeout: float = 5.0) -> bool:
        """Wait until the thread has handled every earlier command, no replay runs or waits, and a
        poll found nothing to read. False on timeout or when the thread is not running."""
        if not self.running:
            return False
        idle = threading.Event()
        self._commands.put(_Command("barrier", idle=idle))
        self._wake()
        return idle.wait(timeout) and not self._stopping.is_set()

    def flush(self) -> bool:
        """End a batch-window pause that has run for ``flush_after_seconds`` or longer, so the
        thread reads the messages that gathered meanwhile; True when it did. Called as a request
        arrives, before its body is read: its decision then sees the index without the window's
        lag, while requests closer together than ``flush_after_seconds`` share one wake-up. Any
        thread; without a pause to end it only reads a clock."""
        paused_at = self._paused_at
        if not paused_at or time.monotonic() - paused_at < self.tuning.flush_after_seconds:
            return False
        self._paused_at = 0.0  # one wake-up per pause, whoever else arrives meanwhile
        self._drained.clear()
        self.flushes += 1
        self._wake()  # also when the pause has just ended: the round it forces sets ``_drained``
        return True

    def wait_flushed(self, timeout: float | None = None) -> bool:
        """Wait until the round a ``flush`` started has read what the pause gathered, at most
        ``timeout`` seconds (default ``flush_wait_seconds``); True at once when no flush is
        outstanding, False when the wait ran out."""
        return self._drained.wait(self.tuning.flush_wait_seconds if timeout is None else timeout)

    def on_thread(self, call: Callable[[list[Source]], Any]) -> Future[Any]:
        """Run ``call(sources)`` on the ingestion thread, between two messages (a consistent view
        of the index and every source's position); cancelled when the thread is not running."""
        result: Future[Any] = Future()
        with self._wake_lock:
            if self._closed or self._thread is None:
                result.cancel()
                return result
            self._commands.put(_Command("call", call=call, result=result))
        self._wake()
        return result

    @property
    def restored(self) -> RestoreTable:
        """Positions of a loaded warm-restart snapshot (fill before adding endpoints)."""
        return self._ingest.restored

    def sources(self) -> list[SourceState]:
        """A snapshot of every source's state (for the debug API)."""
        return [copy.copy(state) for state in list(self.stats.sources.values())]

    def diagnostics(self) -> dict[str, object]:
        """Loop facts for the debug API and benchmarks: thread id, rounds run, batch-window pauses
        taken and ended early, flushes, how long the running pause has lasted, sockets polled."""
        thread = self._thread
        paused_at = self._paused_at
        return {
            "running": self.running,
            "thread_id": thread.native_id if thread is not None else None,
            "rounds": self._reactor.rounds,
            "pauses": self.pauses,
            "pauses_cut": self.pauses_cut,
            "flushes": self.flushes,
            "paused_for": time.monotonic() - paused_at if paused_at else 0.0,
            "sockets": len(self._reactor),
        }

    def _submit(self, kind: str, endpoint: EventEndpoint) -> Future[None]:
        done: Future[None] = Future()
        command = _Command(kind, endpoint, done)
        with self._wake_lock:
            if self._closed:
                self._run_closed(command)
                return done
            self._commands.put(command)
            if self._wake_tx is not None:
                try:
                    self._wake_tx.send(b"", zmq.NOBLOCK)
                except zmq.Again:
                    pass  # a wake-up is already pending
        return done

    def _run_closed(self, command: _Command) -> None:
        """A command after the thread finished (caller holds ``_wake_lock``): a removal still
        forgets the endpoint; an addition has nothing to subscribe with."""
        assert command.done is not None and command.endpoint is not None
        if command.kind == "remove":
            self.applier.remove_endpoint(command.endpoint.id)
            command.done.set_result(None)
        else:
            command.done.cancel()

    def _wake(self) -> None:
        with self._wake_lock:
            if self._wake_tx is not None:
                try:
                    self._wake_tx.send(b"", zmq.NOBLOCK)
                except zmq.Again:
                    pass  # a wake-up is already pending

    # --- the ingestion thread ------------------------------------------------------------------

    def _run(self) -> None:
        assert self._context is not None and self._wake_rx is not None
        replay_port = self.config.pod_discovery.replay_socket_port
        if not self.central and replay_port > 0:
            self._ingest.replays = ReplayManager(
                self._context,
                self._reactor,
                self._ingest,
                self.stats,
                self.tuning.replay,
                hwm=self.tuning.replay_hwm,
                budget=self.tuning.drain_budget,
            )
        self._subscribers = Subscribers(
            self._context,
            self._reactor,
            self._ingest,
            self.config,
            self.stats,
            self.tuning,
            self._warn,
            self._curve,
        )
        if self.central:
            self._subscribers.open_central()
        self._reactor.add(self._wake_rx, self._on_wake, priority=True)
        log.info(
            "kv_transport_started",
            mode="central" if self.central else "per_endpoint",
            endpoint=self.config.zmq_endpoint or None,
            socket_port=None if self.central else self.config.pod_discovery.socket_port,
            replay_socket_port=replay_port or None,
        )
        try:
            self._loop()
        finally:
            self._teardown()

    def _loop(self) -> None:
        tuning = self.tuning
        interval = tuning.poll_interval_seconds
        window = self.config.batch_window_seconds
        density = StreamDensity(window, tuning.dense_messages_per_second, tuning.small_message_bytes)
        reactor = self._reactor
        subscribers = self._subscribers
        assert subscribers is not None
        self._on_wake()
        while not self._stopping.is_set():
            try:
                # Until the next timer is due: an idle thread sleeps in the selector.
                timer = max(0.0, reactor.next_timer - time.monotonic())
                wait = 0.01 if self._barriers else min(interval, timer)
                active = reactor.run_once(wait)
                if not self._drained.is_set():
                    self._drained.set()
                if active:
                    # Not ``_busy()``: sources hold messages only while a replay runs or waits,
                    # and scanning every source after each round would cost the event path.
                    replays = self._ingest.replays
                    backlog = bool(self._barriers) or reactor.pending or (replays is not None and replays.busy)
                    sparse = window > 0 and density.update(time.monotonic(), subscribers.read, subscribers.read_bytes)
                    pause = tuning.pause_after(active, reactor.waited, window=window if sparse else 0.0, backlog=backlog)
                    if pause:
                        self.pauses += sparse
                        self._paused_at = time.monotonic()
                        # More messages per wake-up; commands, monitors and ``flush`` end it.
                        self.pauses_cut += reactor.pause(pause)
                        self._paused_at = 0.0
                now = time.monotonic()
                if now >= reactor.next_timer:
                    reactor.next_timer = now + interval  # each tick below lowers it to its next timer
                    self._tick(now)
                if self._barriers and not active and not self._busy():
                    for idle in self._barriers:
                        idle.set()
                    self._barriers.clear()
            except Exception:  # the loop boundary: log, count, continue
                self.stats.count(UNATTRIBUTED, "internal_errors")
                log.exception("kv_ingest_loop_error")
                self._stopping.wait(0.05)

    def _busy(self) -> bool:
        replays = self._ingest.replays
        subscribers = self._subscribers
        return (replays is not None and replays.busy) or (subscribers is not None and subscribers.busy())

    def _tick(self, now: float) -> None:
        self._ingest.expire_restored(now)
        if self._ingest.restored.parts:
            self._reactor.timer_at(self._ingest.restored.deadline)
        if self._ingest.replays is not None:
            self._ingest.replays.tick(now)
        if self._subscribers is not None:
            self._subscribers.tick(now)

    def _on_wake(self) -> bool:
        assert self._wake_rx is not None
        while True:
            try:
                self._wake_rx.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return False
            try:
                if command.kind == "barrier":
                    assert command.idle is not None
                    self._barriers.append(command.idle)
                    continue
                if command.kind == "call":
                    assert command.call is not None and command.result is not None
                    subs = self._subscribers
                    sources = list(subs.sources.values()) if subs is not None else []
                    try:
                        command.result.set_result(command.call(sources))
                    except Exception as exc:  # handed to the caller
                        command.result.set_exception(exc)
                    continue
                assert command.endpoint is not None and self._subscribers is not None
                if command.kind == "add":
                    self._subscribers.add(command.endpoint)
                else:
                    self._subscribers.remove(command.endpoint)
            except Exception as exc:
                self.stats.count(UNATTRIBUTED, "internal_errors")
                log.exception("kv_transport_command_failed", command=command.kind)
                if command.done is not None:
                    command.done.set_exception(exc)
                continue
            if command.done is not None:
                command.done.set_result(None)

    def _teardown(self) -> None:
        if self._ingest.replays is not None:
            self._ingest.replays.close_all()
        if self._subscribers is not None:
            self._subscribers.close_all()
        if self._wake_rx is not None:
            self._reactor.remove(self._wake_rx)
        self._reactor.close()
        close_socket(self._wake_rx)
        for idle in self._barriers:
            idle.set()
        with self._wake_lock:
            self._closed = True
            while True:
                try:
                    command = self._commands.get_nowait()
                except queue.Empty:
                    break
                if command.idle is not None:
                    command.idle.set()
                elif command.result is not None:
                    command.result.cancel()
                else:
                    self._run_closed(command)
            if self._wake_tx is not None:
                self._wake_tx.close(0)
                self._wake_tx = None
        if self._context is not None:
            self._context.destroy(linger=0)
        log.info("kv_transport_stopped")
