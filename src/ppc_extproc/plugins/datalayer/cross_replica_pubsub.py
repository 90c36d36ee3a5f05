"""Pub/sub on raw connections, for the in-flight channel: redis-py's parser costs ~0.1–0.3 ms of
CPU per message, and every replica receives every replica's every change.

``subscribe_messages``: ``SUBSCRIBE`` on its own connection, yielding each message's payload.

``ImmediatePublisher`` — ``PUBLISH`` written at once: one dedicated connection to the store on which a replica's in-flight
change goes out synchronously, from inside the routing decision that made it (no wait for a task
to be scheduled, nor for the previous reply). A reader task drains the replies; a closed
connection, an error reply or a stalled store (unsent bytes beyond ``max_buffer``; the caller also
checks ``stalled``: writes unanswered too long) closes it, and
``publish`` then returns False so the caller falls back to its background publish. Messages carry
a sequence number, so their order against the background path's does not matter.

RESP as the Redis protocol spec writes it (``*<n>`` arrays of ``$<len>`` bulk strings).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence

__all__ = ["ImmediatePublisher", "open_connection", "resp_command", "subscribe_messages"]


def resp_command(*parts: bytes) -> bytes:
    out = [b"*%d\r\n" % len(parts)]
    for part in parts:
        out.append(b"$%d\r\n%s\r\n" % (len(part), part))
    return b"".join(out)


async def open_connection(
    host: str, port: int, password: str | None, timeout: float
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Connect (and AUTH) within ``timeout``; raises ``OSError`` / ``TimeoutError`` / ``ConnectionError``."""
    async with asyncio.timeout(timeout):
        reader, writer = await asyncio.open_connection(host, port)
        try:
            if password is not None:
                writer.write(resp_command(b"AUTH", password.encode()))
                reply = await reader.readline()
                if not reply.startswith(b"+OK"):
                    raise ConnectionError("the store refused AUTH")
        except BaseException:
            writer.close()
            raise
    return reader, writer


async def _read_reply(reader: asyncio.StreamReader, head: bytes) -> list[bytes]:
    """The rest of one RESP2 array of bulk strings and integers (a pub/sub push) whose first line
    is ``head``; raises ``ConnectionError``."""
    if not head.startswith(b"*"):
        raise ConnectionError("the store closed the connection" if not head else f"unexpected reply {head[:40]!r}")
    items: list[bytes] = []
    for _ in range(int(head[1:])):
        line = await reader.readline()
        if line.startswith(b"$"):
            items.append((await reader.readexactly(int(line[1:]) + 2))[:-2])
        elif line.startswith(b":"):
            items.append(line[1:].rstrip())
        else:
            raise ConnectionError(f"unexpected reply {line[:40]!r}")
    return items


async def subscribe_messages(
    host: str, port: int, password: str | None, channel: str, timeout: float,
    on_message: Callable[[bytes], None], on_connected: Callable[[], Awaitable[None]],
    poll_seconds: float, running: Callable[[], bool],
) -> None:  # fmt: skip
    """Subscribe to ``channel`` and hand each message's payload to ``on_message`` until the
    connection fails (raises) or ``running()`` turns False (checked every ``poll_seconds``)."""
    reader, writer = await open_connection(host, port, password, timeout)
    try:
        writer.write(resp_command(b"SUBSCRIBE", channel.encode()))
        async with asyncio.timeout(timeout):
            confirm = await _read_reply(reader, await reader.readline())
        if not confirm or confirm[0] != b"subscribe":
            raise ConnectionError("the store did not confirm SUBSCRIBE")
        await on_connected()
        while running():
            try:
                # Only the first line waits under the timeout: a cancelled readline consumes nothing.
                async with asyncio.timeout(poll_seconds):
                    head = await reader.readline()
            except TimeoutError:
                continue
            items = await _read_reply(reader, head)
            if len(items) == 3 and items[0] == b"message":
                on_message(items[2])
    finally:
        writer.close()


class ImmediatePublisher:
    """One connection for ``PUBLISH <channel> <payload>``, written without awaiting the reply."""

    def __init__(self, host: str, port: int, password: str | None, channel: str, *, max_buffer: int = 1 << 20) -> None:
        self.host, self.port, self.password = host, port, password
        self.channel = channel.encode()
        self.max_buffer = max_buffer
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        #: When each publish written and not yet answered was written (``time.monotonic()``).
        self._sent: deque[float] = deque()

    @property
    def connected(self) -> bool:
        return self._writer is not None

    @property
    def outstanding(self) -> int:
        """Publishes written and not yet answered."""
        return len(self._sent)

    def stalled(self, now: float, timeout: float) -> bool:
        """True when the oldest unanswered publish was written more than ``timeout`` ago."""
        return bool(self._sent) and now - self._sent[0] > timeout

    async def connect(self, timeout: float) -> None:
        """Open the connection (and AUTH); raises ``OSError`` / ``TimeoutError`` / ``ConnectionError``."""
        self.close()
        reader, writer = await open_connection(self.host, self.port, self.password, timeout)
        self._writer = writer
        self._sent.clear()
        self._reader_task = asyncio.get_running_loop().create_task(self._drain(reader, writer))

    def publish(self, payload: str | None, commands: Sequence[tuple[bytes, ...]] = ()) -> bool:
        """Write ``commands`` (each answered by one integer) and one PUBLISH of ``payload`` (None:
        none) now, in one write; False (nothing written) when not connected or the store is stalled."""
        writer = self._writer
        if writer is None:
            return False
        if writer.transport.is_closing() or writer.transport.get_write_buffer_size() > self.max_buffer:
            self.close()
            return False
        parts = [resp_command(*c) for c in commands]
        if payload is not None:
            parts.append(resp_command(b"PUBLISH", self.channel, payload.encode()))
        if not parts:
            return True
        writer.write(b"".join(parts))
        now = time.monotonic()
        self._sent.extend(now for _ in parts)
        return True

    async def _drain(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                line = await reader.readline()
                if not line or line.startswith(b"-"):  # closed, or an error reply
                    break
                if self._sent:
                    self._sent.popleft()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            if self._writer is writer:
                self._writer = None
            writer.close()

    def close(self) -> None:
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()
        if self._reader_task is not None and not self._reader_task.done():
            self._reader_task.cancel()
        self._reader_task = None

    async def aclose(self) -> None:
        task = self._reader_task
        self.close()
        if task is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(task, 1.0)
