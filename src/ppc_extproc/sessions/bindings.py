"""Session bindings as routing uses them: the local table, read through a shared store when one
is configured, with the store never able to fail a request.

    bindings = SessionBindings("session-affinity-scorer", table, store_config)
    await bindings.start()                         # opens the store (a no-op without one)
    endpoint = await bindings.lookup("s-1")        # ≤ 1 round trip, bounded by the timeout
    await bindings.commit_shared("s-1", picked, replacing=None)  # local, then the store (bounded)
    bindings.commit("s-1", served, replacing=picked)  # local now; the store in the background
    await bindings.stop()

Failure rule: a store call that fails or takes longer than ``timeout_seconds`` counts an error and
the local table answers; after ``failure_threshold`` in a row the store is skipped for
``retry_seconds`` (a dead store then costs nothing per request; one slow reply costs no skip).
A binding made while the store was away is written when it is next used, so replicas re-converge
on the store's winner. A binding made by a pick is written before the routing answer (``commit_shared``, bounded by
the timeout); the ones that follow a response (Envoy served elsewhere) go through a bounded queue
drained by one task: a full queue drops the write (counted), never the request.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from ppc_extproc.ids import EndpointId
from ppc_extproc.sessions.store import BindingStore, open_store
from ppc_extproc.sessions.table import BindingTable, session_key

__all__ = ["SessionBindings", "StoreConfig", "StoreStats"]

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class StoreConfig:
    """Where and how bindings are shared; ``address`` "" keeps them local to this replica."""

    address: str = ""
    key_prefix: str = "ppc-extproc:sessions"
    #: Bound on one store call on the request path (and on each background write).
    timeout_seconds: float = 0.05
    #: Failures in a row (errors or timeouts) after which the store is skipped ...
    failure_threshold: int = 3
    #: ... for this long, before it is tried again.
    retry_seconds: float = 1.0
    #: Pending background writes; past it a write is dropped (the local binding stays).
    max_pending_writes: int = 10_000


@dataclass(slots=True)
class StoreStats:
    """Store outcomes since start (``/debug/state``)."""

    reads: int = 0
    hits: int = 0
    writes: int = 0
    #: Writes that found another replica's binding and adopted it.
    adopted: int = 0
    errors: int = 0
    dropped_writes: int = 0
    #: Lookups answered locally because the store was failing or being skipped.
    local_fallbacks: int = 0


@dataclass(frozen=True, slots=True)
class _Write:
    key: str
    session: str
    endpoint: EndpointId
    replacing: EndpointId | None


class SessionBindings:
    """One plugin instance's bindings: local, and shared when a store address is configured."""

    def __init__(
        self,
        owner: str,
        table: BindingTable,
        config: StoreConfig | None = None,
        *,
        store: BindingStore | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.owner = owner
        self.table = table
        self.config = config or StoreConfig()
        self._store = store
        self._clock = clock
        self._skip_until = 0.0
        self._failures_in_a_row = 0
        self._queue: asyncio.Queue[_Write] | None = None
        self._writer: asyncio.Task[None] | None = None
        self.stats = StoreStats()
        self._ttl_ms = max(1, int(table.ttl_seconds * 1000))

    @property
    def shared(self) -> bool:
        return bool(self.config.address) or self._store is not None

    @property
    def store_up(self) -> bool | None:
        """None without a store; else False while the store is being skipped after failures."""
        if not self.shared:
            return None
        return self._clock() >= self._skip_until

    async def start(self) -> None:
        if not self.shared:
            return
        if self._store is None:
            self._store = open_store(self.config.address, self.config.timeout_seconds)
        self._queue = asyncio.Queue(self.config.max_pending_writes)
        self._writer = asyncio.create_task(self._drain(), name=f"session-bindings:{self.owner}")

    async def stop(self) -> None:
        if self._writer is not None:
            self._writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._writer
            self._writer = None
        if self._store is not None:
            with contextlib.suppress(Exception):
                await self._store.close()

    def _key(self, session: str) -> str:
        return f"{self.config.key_prefix}:{self.owner}:{session_key(session)}"

    def _usable(self) -> BindingStore | None:
        if self._store is None or self._queue is None or self._clock() < self._skip_until:
            return None
        return self._store

    def _failed(self, operation: str, exc: BaseException) -> None:
        self.stats.errors += 1
        self._failures_in_a_row += 1
        if self._failures_in_a_row < self.config.failure_threshold:
            return
        if self._failures_in_a_row == self.config.failure_threshold:
            log.warning("session_store_unavailable", plugin=self.owner, operation=operation,
                        error=type(exc).__name__, retry_seconds=self.config.retry_seconds)
        self._skip_until = self._clock() + self.config.retry_seconds

    def _succeeded(self) -> None:
        if self._failures_in_a_row >= self.config.failure_threshold:
            log.info("session_store_available", plugin=self.owner)
        self._failures_in_a_row = 0

    async def lookup(self, session: str) -> EndpointId | None:
        """The endpoint ``session`` is bound to: the store's binding when it answers in time
        (adopted locally), else the local one."""
        store = self._usable()
        if store is None:
            if self.shared:
                self.stats.local_fallbacks += 1
            return self.table.get(session)
        self.stats.reads += 1
        try:
            async with asyncio.timeout(self.config.timeout_seconds):
                shared = await store.get(self._key(session), self._ttl_ms)
        except Exception as exc:  # any store failure: route on the local table
            self._failed("read", exc)
            self.stats.local_fallbacks += 1
            return self.table.get(session)
        self._succeeded()
        if shared is not None:
            self.stats.hits += 1
            self.table.bind(session, shared)
            return shared
        local = self.table.get(session)
        if local is not None:  # bound while the store was away (or the store lost it): share it
            self._enqueue(_Write(self._key(session), session, local, None))
        return local

    def commit(self, session: str, endpoint: EndpointId, replacing: EndpointId | None) -> None:
        """Record that ``session`` was routed to ``endpoint`` (``replacing``: the binding it
        moves from, whose pod is gone). Local at once; the store in the background."""
        write = self._bind_locally(session, endpoint, replacing)
        if write is not None:
            self._enqueue(write)

    async def commit_shared(self, session: str, endpoint: EndpointId, replacing: EndpointId | None) -> None:
        """``commit``, with the store write awaited (within ``timeout_seconds``): on return the
        other replicas' lookups see the binding, or the store failed (counted) and the local
        binding stands. For the request path, so a client's next turn finds its binding on any
        replica; a binding that did not change costs nothing."""
        write = self._bind_locally(session, endpoint, replacing)
        if write is not None:
            await self._write(write)

    def _bind_locally(self, session: str, endpoint: EndpointId, replacing: EndpointId | None) -> _Write | None:
        """Bind in the local table; the store write to make, when the binding changed."""
        unchanged = self.table.peek(session) == endpoint
        self.table.bind(session, endpoint)
        if unchanged or not self.shared:
            return None
        return _Write(self._key(session), session, endpoint, replacing)

    def _enqueue(self, write: _Write) -> None:
        if self._queue is None:
            return
        try:
            self._queue.put_nowait(write)
        except asyncio.QueueFull:
            self.stats.dropped_writes += 1

    async def _drain(self) -> None:
        assert self._queue is not None
        while True:
            write = await self._queue.get()
            try:
                await self._write(write)
            finally:
                self._queue.task_done()

    async def _write(self, write: _Write) -> None:
        store = self._usable()
        if store is None:
            self.stats.dropped_writes += 1  # written again when the session is next used
            return
        try:
            async with asyncio.timeout(self.config.timeout_seconds):
                winner = await store.bind(write.key, write.endpoint, write.replacing, self._ttl_ms)
        except Exception as exc:  # any store failure: the local binding stands
            self._failed("write", exc)
            return
        self._succeeded()
        self.stats.writes += 1
        if winner != write.endpoint:
            self.stats.adopted += 1
            self.table.bind(write.session, winner)

    async def flush(self, timeout_seconds: float = 5.0) -> None:
        """Wait until the writes queued so far are done (tests and shutdown)."""
        if self._queue is None:
            return
        async with asyncio.timeout(timeout_seconds):
            await self._queue.join()
