"""KV-event publishers: vLLM's ``ZmqEventPublisher`` on asyncio, plus null and in-memory ones.

Wire behaviour (``vllm-project/vllm: vllm/distributed/kv_events.py`` ``ZmqEventPublisher``):

* PUB frames ``[topic, seq (8-byte big-endian, from 0, +1 per batch), payload]``;
* optional ROUTER replay socket keeping the last ``buffer_steps`` batches. A request
  ``[identity, b"", seq8]`` is answered with one message per retained batch with
  ``seq >= start`` — ``[identity, b"", topic, seq8, payload]`` (vLLM ≥0.26, ``"new"``) or
  ``[identity, b"", seq8, payload]`` (≤0.25, ``"old"``) — then the end marker
  ``[identity, b"", b"", ff×8, b""]`` (new) / ``[identity, b"", ff×8, b""]`` (old). Requests
  with another frame count get no reply.
* :meth:`restart` is an engine restart as subscribers see it: seq back to 0 and the replay
  buffer emptied (no AllBlocksCleared is sent).

Unlike vLLM the endpoint is always bound, never connected; port ``0`` (or ``*``) binds an
ephemeral port, reported by :attr:`ZmqEventPublisher.endpoint`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Sequence
from typing import Final, Literal, Protocol, TypeAlias

import structlog
import zmq
import zmq.asyncio

from ppc_extproc_lab.mock_vllm.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    Encoding,
    EventEncoder,
    KVEventBatch,
)

__all__ = [
    "END_SEQ",
    "EventPublisher",
    "MemoryEventPublisher",
    "NullEventPublisher",
    "ReplayFormat",
    "ZmqEventPublisher",
    "default_topic",
]

logger = structlog.get_logger()

ReplayFormat: TypeAlias = Literal["new", "old"]
Event: TypeAlias = BlockStored | BlockRemoved | AllBlocksCleared

#: Replay end-of-stream sequence number, ``(-1).to_bytes(8, "big", signed=True)``.
END_SEQ: Final = b"\xff" * 8


def default_topic(advertised_endpoint: str, model: str) -> str:
    """llm-d's topic convention ``kv@<ip:port>@<model>``."""
    return f"kv@{advertised_endpoint}@{model}"


class EventPublisher(Protocol):
    """What the engine needs from a publisher."""

    topic: str

    @property
    def next_seq(self) -> int:
        """The sequence number the next batch will carry."""
        ...

    def publish(self, events: Sequence[Event], ts: float | None = None) -> int | None:
        """Send one batch; return its seq (None when nothing is published)."""
        ...

    def restart(self) -> None:
        """Seq back to 0, replay buffer emptied."""
        ...

    async def start(self) -> None:
        """Start background work (the replay responder)."""
        ...

    async def close(self) -> None:
        """Stop and release sockets (linger 0)."""
        ...


class _BufferedPublisher:
    """Sequence numbering, encoding and the replay buffer shared by the real publishers."""

    def __init__(
        self,
        *,
        topic: str = "",
        encoding: Encoding = "map",
        buffer_steps: int = 10_000,
        data_parallel_rank: int = 0,
    ) -> None:
        self.topic = topic
        self._topic_bytes = topic.encode("utf-8")
        self._encoder = EventEncoder(encoding)
        self.encoding: Encoding = encoding
        self.buffer_steps = buffer_steps
        self.data_parallel_rank = data_parallel_rank
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=max(buffer_steps, 0) or None)
        self._seq = 0
        self.batches_published = 0
        self.events_published = 0

    @property
    def next_seq(self) -> int:
        return self._seq

    def publish(self, events: Sequence[Event], ts: float | None = None) -> int | None:
        """Encode and send ``events`` as one batch. A failure still consumes the seq, as in vLLM."""
        if not events:
            return None
        seq = self._seq
        self._seq += 1
        stamp = time.time() if ts is None else ts
        try:
            payload = self._encoder.encode(
                KVEventBatch(stamp, list(events), self.data_parallel_rank)
            )
            self._send((self._topic_bytes, seq.to_bytes(8, "big"), payload))
        except Exception:
            logger.exception("kv_batch_publish_failed", topic=self.topic, seq=seq)
            return seq
        if self.buffer_steps > 0:
            self._buffer.append((seq, payload))
        self.batches_published += 1
        self.events_published += len(events)
        return seq

    def restart(self) -> None:
        self._seq = 0
        self._buffer.clear()

    def retained(self, start_seq: int = 0) -> list[tuple[int, bytes]]:
        """The buffered ``(seq, payload)`` pairs with ``seq >= start_seq``, oldest first."""
        return [(s, p) for s, p in self._buffer if s >= start_seq]

    def _send(self, frames: tuple[bytes, bytes, bytes]) -> None:
        raise NotImplementedError


class NullEventPublisher:
    """Publishes nothing (``--kv-events-endpoint ''``)."""

    def __init__(self, topic: str = "") -> None:
        self.topic = topic

    @property
    def next_seq(self) -> int:
        return 0

    def publish(self, events: Sequence[Event], ts: float | None = None) -> int | None:
        return None

    def restart(self) -> None:
        return None

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None


class MemoryEventPublisher(_BufferedPublisher):
    """Keeps every sent message as ``(topic, seq8, payload)`` in :attr:`frames` (tests)."""

    def __init__(
        self,
        *,
        topic: str = "",
        encoding: Encoding = "map",
        buffer_steps: int = 10_000,
        data_parallel_rank: int = 0,
    ) -> None:
        super().__init__(
            topic=topic,
            encoding=encoding,
            buffer_steps=buffer_steps,
            data_parallel_rank=data_parallel_rank,
        )
        self.frames: list[tuple[bytes, bytes, bytes]] = []

    def _send(self, frames: tuple[bytes, bytes, bytes]) -> None:
        self.frames.append(frames)

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None


def _bind(sock: zmq.Socket[bytes], endpoint: str) -> str:
    """Bind ``endpoint`` (port 0 ⇒ ephemeral) and return the bound address; ``OSError`` with the
    endpoint as its ``filename`` when it cannot be bound."""
    given = endpoint
    if endpoint.startswith("tcp://") and endpoint.endswith(":0"):
        endpoint = endpoint[:-1] + "*"
    if endpoint.startswith("tcp://") and ("[" in endpoint or "::" in endpoint):
        sock.setsockopt(zmq.IPV6, 1)
    try:
        sock.bind(endpoint)
    except zmq.ZMQError as exc:
        raise OSError(exc.errno, zmq.strerror(exc.errno) if exc.errno is not None else str(exc), given) from None
    last = sock.getsockopt(zmq.LAST_ENDPOINT)
    return last.decode() if isinstance(last, bytes) else str(last)


class ZmqEventPublisher(_BufferedPublisher):
    """PUB publisher with an optional ROUTER replay responder, driven by the asyncio loop."""

    def __init__(
        self,
        endpoint: str,
        *,
        topic: str = "",
        encoding: Encoding = "map",
        replay_endpoint: str | None = None,
        buffer_steps: int = 10_000,
        hwm: int = 100_000,
        replay_format: ReplayFormat = "new",
        data_parallel_rank: int = 0,
        context: zmq.Context[zmq.Socket[bytes]] | None = None,
    ) -> None:
        super().__init__(
            topic=topic,
            encoding=encoding,
            buffer_steps=buffer_steps,
            data_parallel_rank=data_parallel_rank,
        )
        if replay_format not in ("new", "old"):
            raise ValueError(f"unknown replay format {replay_format!r}")
        self.replay_format: ReplayFormat = replay_format
        ctx = context or zmq.Context.instance()
        self._pub: zmq.Socket[bytes] = ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._pub.set_hwm(hwm)
        self._router: zmq.asyncio.Socket | None = None
        self._task: asyncio.Task[None] | None = None
        try:
            self.endpoint = _bind(self._pub, endpoint)
            self.replay_endpoint: str | None = None
            if replay_endpoint:
                actx = zmq.asyncio.Context(ctx)
                self._router = actx.socket(zmq.ROUTER)
                self._router.setsockopt(zmq.LINGER, 0)
                self._router.setsockopt(zmq.SNDHWM, 2 * (buffer_steps + 1))
                self.replay_endpoint = _bind(self._router, replay_endpoint)  # type: ignore[arg-type]
        except Exception:
            self._close_sockets()
            raise

    def _send(self, frames: tuple[bytes, bytes, bytes]) -> None:
        # PUB never blocks: past the high-water mark ZMQ drops the message (a seq gap downstream).
        self._pub.send_multipart(frames, flags=zmq.NOBLOCK)

    async def start(self) -> None:
        """Start answering replay requests (no-op without a replay endpoint)."""
        if self._router is not None and self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._serve_replay(), name="mock-vllm-replay"
            )

    async def _serve_replay(self) -> None:
        router = self._router
        assert router is not None
        while True:
            frames = await router.recv_multipart()
            try:
                await self._answer_replay(router, frames)
            except zmq.ZMQError:
                logger.exception("kv_replay_failed", topic=self.topic)

    async def _answer_replay(self, router: zmq.asyncio.Socket, frames: list[bytes]) -> None:
        if len(frames) != 3:
            logger.warning("kv_replay_invalid_request", topic=self.topic, frames=len(frames))
            return
        identity, _, start_bytes = frames
        start = int.from_bytes(start_bytes, "big")
        new = self.replay_format == "new"
        sent = 0
        for seq, payload in self.retained(start):
            seq8 = seq.to_bytes(8, "big")
            msg = (
                [identity, b"", self._topic_bytes, seq8, payload]
                if new
                else [identity, b"", seq8, payload]
            )
            await router.send_multipart(msg)
            sent += 1
        end = [identity, b"", b"", END_SEQ, b""] if new else [identity, b"", END_SEQ, b""]
        await router.send_multipart(end)
        logger.debug("kv_replay_served", topic=self.topic, start_seq=start, batches=sent)

    async def close(self) -> None:
        """Cancel the replay responder and close both sockets with linger 0."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self._close_sockets()

    def _close_sockets(self) -> None:
        if not self._pub.closed:
            self._pub.close(linger=0)
        if self._router is not None and not self._router.closed:
            self._router.close(linger=0)
