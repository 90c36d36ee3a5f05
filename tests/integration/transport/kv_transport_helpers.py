"""Helpers of the KV-event transport tests: vLLM-like publishers and replay ROUTERs on loopback.

Publishers bind ``tcp://127.0.0.N:<port>`` (the whole 127/8 is local), so several "pods" share one
port number as real pods do. The publisher is an XPUB (a PUB that also sees subscriptions) so a
test can wait until a subscriber's subscription arrived instead of sleeping. Every socket, thread
and transport is closed in teardown.
"""

from __future__ import annotations

import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import pytest
import zmq

from ppc_extproc.events.apply import EventApplier
from ppc_extproc.events.transport import ReplayPolicy, TransportTuning
from ppc_extproc.framework import Endpoint

MODEL = "my-model"
POD_PORT = 8000
END = b"\xff" * 8

#: Short replay limits so failure paths finish quickly.
FAST = TransportTuning(
    replay=ReplayPolicy(
        idle_timeout_seconds=1.0,
        total_timeout_seconds=5.0,
        max_attempts=2,
        cooldown_seconds=0.5,
        max_concurrent=8,
    ),
    poll_interval_seconds=0.01,
    reconnect_interval_seconds=0.02,
    reconnect_interval_max_seconds=0.2,
    log_interval_seconds=0.0,
)


def wait_until(
    predicate: Callable[[], Any],
    timeout: float = 5.0,
    what: str = "condition",
    context: Callable[[], Any] | None = None,
) -> Any:
    """Poll ``predicate`` until truthy; fail the test after ``timeout`` seconds, showing
    ``context()`` (e.g. the ingest counters) in the message."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            detail = f": {context()}" if context is not None else ""
            pytest.fail(f"timed out waiting for {what}{detail}")
        time.sleep(0.002)


def pause_in_flight(transport: Any, after: float = 0.05) -> None:
    """Wait until the ingestion thread's batch-window pause has run ``after`` seconds, and not
    0.4 s more (of a 1 s window: the pause still has a while to run)."""
    wait_until(lambda: after <= transport.diagnostics()["paused_for"] <= after + 0.4, timeout=10,
               what="a pause under way", context=transport.diagnostics)


def _try_bind(sock: zmq.Socket[Any], address: str) -> bool:
    try:
        sock.bind(address)
    except zmq.ZMQError as exc:
        if exc.errno != zmq.EADDRINUSE:
            raise
        return False
    return True


def free_port(ip: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((ip, 0))
        return int(s.getsockname()[1])


class Publisher:
    """A vLLM engine's KV-event publisher: frames [topic, BE64 seq, payload], seq from 0, and the
    last ``buffer_steps`` batches kept for a replay ROUTER."""

    def __init__(
        self,
        context: zmq.Context[Any],
        ip: str,
        port: int | None = None,
        *,
        topic: bytes | None = None,
        connect: str | None = None,
        buffer_steps: int = 10_000,
        curve: tuple[bytes, bytes, bytes] | None = None,
    ) -> None:
        self.context = context
        self.ip = ip
        self.topic = topic if topic is not None else f"kv@{ip}:{POD_PORT}@{MODEL}".encode()
        self.connect_to = connect
        self.seq = 0
        self.lock = threading.Lock()
        self.buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self.port = port
        #: CURVE client keys (server public, own public, own secret), set before connecting.
        self.curve = curve
        self.sock = self._open()

    def _open(self) -> zmq.Socket[Any]:
        sock: zmq.Socket[Any] = self.context.socket(zmq.XPUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, 100_000)
        if self.curve is not None:
            server_public, public, secret = self.curve
            sock.setsockopt(zmq.CURVE_SERVERKEY, server_public)
            sock.setsockopt(zmq.CURVE_PUBLICKEY, public)
            sock.setsockopt(zmq.CURVE_SECRETKEY, secret)
        if self.connect_to:
            sock.connect(self.connect_to)
        elif self.port is None:
            self.port = sock.bind_to_random_port(f"tcp://{self.ip}")
        else:
            # A just-closed listener is released asynchronously: retry the same port briefly.
            wait_until(lambda: _try_bind(sock, f"tcp://{self.ip}:{self.port}"), what="port free")
        return sock

    @property
    def endpoint(self) -> Endpoint:
        return Endpoint(self.ip, POD_PORT)

    @property
    def endpoint_id(self) -> str:
        return f"{self.ip}:{POD_PORT}"

    def wait_subscribed(self, timeout: float = 5.0) -> bytes:
        """Block until a subscription message arrives (the subscriber can now receive)."""
        if not self.sock.poll(int(timeout * 1000)):
            pytest.fail(f"no subscriber reached the publisher on {self.ip}:{self.port}")
        return bytes(self.sock.recv())

    def probe_until(self, predicate: Callable[[], Any], timeout: float = 5.0) -> None:
        """Send one-frame probes (bad frames to a subscriber) until ``predicate`` holds. After a
        reconnect an XPUB does not report the re-sent subscription, so this is how a test learns
        that messages get through again."""
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                pytest.fail(f"probes from {self.ip}:{self.port} never arrived")
            self.sock.send(self.topic)
            time.sleep(0.005)

    def send(self, payload: bytes, *, seq: int | None = None, record: bool = True) -> int:
        """Publish one batch with the next (or the given) sequence number."""
        with self.lock:
            if seq is None:
                seq = self.seq
            self.seq = seq + 1
            if record:
                self.buffer.append((seq, payload))
        self.sock.send_multipart([self.topic, seq.to_bytes(8, "big"), payload])
        return seq

    def skip(self, payload: bytes) -> int:
        """Consume a sequence number without sending (a lost message; still replayable)."""
        with self.lock:
            seq = self.seq
            self.seq += 1
            self.buffer.append((seq, payload))
        return seq

    def send_raw(self, frames: list[bytes]) -> None:
        self.sock.send_multipart(frames)

    def restart(self, *, keep_seq: bool = False) -> None:
        """The engine restarts on the same address: a new socket, seq from 0, empty buffer."""
        self.sock.close(0)
        with self.lock:
            if not keep_seq:
                self.seq = 0
            self.buffer.clear()
        self.sock = self._open()

    def close(self) -> None:
        self.sock.close(0)


class ReplayRouter:
    """vLLM's replay ROUTER: ``[id, b"", seq8]`` ⇒ every buffered batch with seq ≥ start, then
    the end marker; ``form`` "new" (vLLM ≥0.26, with topic) or "old" (≤0.25, no topic)."""

    def __init__(self, context: zmq.Context[Any], publisher: Publisher, port: int, *, form: str = "new") -> None:
        self.publisher = publisher
        self.form = form
        #: Ignore requests (an engine without a working replay endpoint).
        self.mute = False
        #: Seconds to wait before answering (vLLM polls its ROUTER once per publisher loop).
        self.delay = 0.0
        #: Ignore this many more requests, then answer (a ROUTER that was briefly unavailable).
        self.ignore = 0
        self.requests: list[int] = []
        #: Monotonic times at which requests arrived and their answers were complete.
        self.arrived: list[float] = []
        self.answered: list[float] = []
        self.sock = context.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(f"tcp://{publisher.ip}:{port}")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            if not self.sock.poll(20):
                continue
            frames = self.sock.recv_multipart()
            if len(frames) != 3:
                continue  # vLLM: "Invalid replay request", no reply
            identity, _, start_frame = frames
            start = int.from_bytes(start_frame, "big")
            self.requests.append(start)
            self.arrived.append(time.monotonic())
            if self.mute or self.ignore > 0:
                self.ignore -= 1
                continue
            if self.delay:
                self._stop.wait(self.delay)
            with self.publisher.lock:
                replies = [(s, p) for s, p in self.publisher.buffer if s >= start]
            topic = self.publisher.topic
            for seq, payload in replies:
                body = [seq.to_bytes(8, "big"), payload]
                self.sock.send_multipart([identity, b"", *([topic] if self.form == "new" else []), *body])
            end = [b"", END, b""] if self.form == "new" else [END, b""]
            self.sock.send_multipart([identity, b"", *end])
            self.answered.append(time.monotonic())

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.sock.close(0)


def holds(applier: EventApplier, endpoint: str, tokens: list[int], model: str = MODEL) -> int:
    """How many leading blocks of ``tokens`` the index says ``endpoint`` holds."""
    keys = applier.processor.keys(tokens, model)
    found = applier.index.lookup(keys, [endpoint])
    n = 0
    for key in keys:
        if key not in found:
            break
        n += 1
    return n


def bad_frames(applier: EventApplier, pub: Publisher) -> int:
    return int(applier.stats.transport.get((pub.endpoint_id, "bad_frames"), 0))
