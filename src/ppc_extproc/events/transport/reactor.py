"""The ingestion thread's event loop core: waits on the sockets' ZMQ_FD notification descriptors
with a selector (epoll on Linux) and runs one handler per socket that has input.

Why not ``zmq.Poller``: ``zmq_poll`` checks every registered socket on every call (tens of µs
with 16 subscribers and their monitors), which dominated the CPU at moderate event rates. The
selector only reports descriptors that were signalled; ``ZMQ_EVENTS`` is then read for those
alone. ZMQ_FD is edge-like (it signals when the socket gets new input, and reading ``ZMQ_EVENTS``
consumes the signal), so a socket whose handler stopped before draining it (the per-socket
budget) stays in the ready set and is revisited without waiting.

Timers (replay deadlines, socket retries) are not polled at a fixed rate: whoever sets one lowers
``next_timer`` (``timer_at``), and the owner's loop waits for input no longer than until then.
"""

from __future__ import annotations

import selectors
import time
from collections.abc import Callable
from typing import cast

import zmq

__all__ = ["Handler", "Reactor"]

Socket = zmq.Socket[bytes]
#: Reads a socket's pending input; True when it stopped early and input may be left.
Handler = Callable[[], bool]


class Reactor:
    """Sockets with one handler each. Priority sockets (connection monitors, the owner's command
    wake-up) are handled before the others of the same round, so a reconnect is known before the
    new connection's messages, and they end a ``pause`` at once."""

    def __init__(self) -> None:
        self._selector = selectors.DefaultSelector()
        #: The priority sockets alone: what ends a ``pause`` early.
        self._urgent = selectors.DefaultSelector()
        self.handlers: dict[Socket, Handler] = {}
        self._fds: dict[Socket, int] = {}
        self._priority: set[Socket] = set()
        #: Sockets that may have input (signalled, or not drained by their handler).
        self._ready: dict[Socket, None] = {}
        #: Rounds run so far (wake-ups, plus the rounds that revisit undrained sockets).
        self.rounds = 0
        #: The earliest time (monotonic) a timer of the owner is due; 0.0: at once.
        self.next_timer = 0.0
        #: Seconds the last round waited for input (0.0 when input was already there).
        self.waited = 0.0

    def __len__(self) -> int:
        return len(self.handlers)

    def add(self, sock: Socket, handler: Handler, *, priority: bool = False) -> None:
        fd = int(sock.getsockopt(zmq.FD))
        self._selector.register(fd, selectors.EVENT_READ, sock)
        self._fds[sock] = fd
        self.handlers[sock] = handler
        if priority:
            self._priority.add(sock)
            self._urgent.register(fd, selectors.EVENT_READ, sock)
        self._ready[sock] = None  # input may predate the registration

    @property
    def pending(self) -> bool:
        """Some socket may still have input (its handler stopped at the budget)."""
        return bool(self._ready)

    def timer_at(self, when: float) -> None:
        """A timer is due at ``when`` (monotonic): the loop's next wait ends by then."""
        if when < self.next_timer:
            self.next_timer = when

    def remove(self, sock: Socket) -> None:
        """Forget ``sock`` (call before closing it)."""
        if self.handlers.pop(sock, None) is None:
            return
        fd = self._fds.pop(sock)
        self._selector.unregister(fd)
        if sock in self._priority:
            self._urgent.unregister(fd)
            self._priority.discard(sock)
        self._ready.pop(sock, None)

    def run_once(self, timeout: float) -> int:
        """Wait up to ``timeout`` seconds for input (not at all while a socket may still have
        some), then run the handler of every socket with input; returns how many had input."""
        ready = self._ready
        self.rounds += 1
        if ready:
            self.waited = 0.0
            events = self._selector.select(0)
        else:
            started = time.monotonic()
            events = self._selector.select(timeout)
            self.waited = time.monotonic() - started
        for key, _ in events:
            ready[key.data] = None
        if not ready:
            return 0
        socks = list(ready)
        if self._priority and len(socks) > 1:
            priority = self._priority
            socks.sort(key=lambda sock: sock not in priority)
        handlers = self.handlers
        handled = 0
        for sock in socks:
            handler = handlers.get(sock)
            if handler is None:  # removed by an earlier handler of this round
                continue
            if not cast(int, sock.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
                ready.pop(sock, None)
                continue
            handled += 1
            if not handler():
                ready.pop(sock, None)
        return handled

    def pause(self, seconds: float) -> bool:
        """Let input gather for up to ``seconds``, ending early when a priority socket signals;
        True when one did. Other sockets' input waits: their notifications stay pending (ZMQ_FD
        is only reset by reading ``ZMQ_EVENTS``), so the next round finds it."""
        events = self._urgent.select(seconds)
        for key, _ in events:
            self._ready[key.data] = None
        return bool(events)

    def close(self) -> None:
        self._selector.close()
        self._urgent.close()
        self.handlers.clear()
        self._fds.clear()
        self._ready.clear()
