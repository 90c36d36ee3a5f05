"""Speculative index entries: the router's own guess, before the engine's KV event confirms it.

Right after a request is routed to endpoint E, every block key of its prompts gets the entry
``(E, tier "", speculative)`` so that the next request with the same prefix follows it, even though
E's BlockStored arrives only later. Entries expire after ``ttl`` seconds, at the owner's next
``expire`` call (``next_expiry`` says when that is worth making); expiry removes only the
speculative entries (confirmed gpu/cpu entries stay), and finds nothing to do on the blocks whose
BlockStored already replaced them (``events.apply``).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ppc_extproc.ids import EndpointId, RequestKey
from ppc_extproc.index.entries import SPECULATIVE_TIER, PodEntry
from ppc_extproc.index.memory import InMemoryIndex

__all__ = ["DEFAULT_MAX_PENDING", "Seeded", "SpeculativeIndexer"]

#: Bound on requests whose speculative entries are pending expiry; beyond it the oldest expire early.
DEFAULT_MAX_PENDING = 100_000


@dataclass(slots=True)
class Seeded:
    """The speculative entries of one request, until they expire or are undone."""

    expires_at: float
    entry: PodEntry
    keys: tuple[Sequence[RequestKey], ...]
    removed: bool = False


class SpeculativeIndexer:
    """Seeds speculative entries and expires them after a fixed TTL (FIFO, since the TTL is fixed)."""

    def __init__(
        self,
        index: InMemoryIndex,
        ttl_seconds: float = 2.0,
        *,
        max_pending: int = DEFAULT_MAX_PENDING,
        clock: Callable[[], float] = time.monotonic,
        tier: str = SPECULATIVE_TIER,
    ) -> None:
        self.index = index
        #: The entries' tier: two indexers with different tiers hold separate entries on one key,
        #: so one's expiry never removes the other's.
        self.tier = tier
        self.ttl_seconds = ttl_seconds if ttl_seconds > 0 else 2.0
        self.max_pending = max_pending
        self.clock = clock
        self._pending: deque[Seeded] = deque()
        self._lock = threading.Lock()
        #: Requests whose entries were expired early because ``max_pending`` was reached.
        self.expired_early = 0
        #: Requests whose entries were undone (rejected or unanswered requests).
        self.undone = 0

    def seed(self, endpoint: EndpointId, keys_per_prompt: Sequence[Sequence[RequestKey]]) -> Seeded | None:
        """Add speculative entries for ``endpoint`` on every key of every prompt; the handle
        undoes them early."""
        prompts = tuple(keys for keys in keys_per_prompt if keys)
        if not prompts:
            return None
        entry = PodEntry(endpoint, self.tier, speculative=True)
        for keys in prompts:
            self.index.add(None, keys, [entry])
        now = self.clock()
        seeded = Seeded(now + self.ttl_seconds, entry, prompts)
        with self._lock:
            self._pending.append(seeded)
            overflow = len(self._pending) - self.max_pending
        if overflow > 0:
            self.expired_early += overflow
            self._expire(lambda item: True, limit=overflow)
        # Due entries are expired by the owner's periodic ``expire`` (the producer's tick), not
        # here: a long prompt's expiry touches every key, and the request being routed would wait.
        return seeded

    def undo(self, seeded: Seeded) -> None:
        """Remove one request's entries now (its engine rejected it or never answered)."""
        with self._lock:
            if seeded.removed:
                return
            seeded.removed = True
        self.undone += 1
        for keys in seeded.keys:
            self.index.evict_request_keys(keys, [seeded.entry])

    def expire(self, now: float | None = None) -> int:
        """Remove the speculative entries of every request whose TTL has passed. Returns how many."""
        deadline = self.clock() if now is None else now
        return self._expire(lambda item: item.expires_at <= deadline)

    def next_expiry(self, now: float) -> float:
        """When ``expire`` next has work: the oldest pending request's expiry time, else a TTL
        after ``now`` (the TTL is fixed, so whatever is seeded from now on expires later still)."""
        with self._lock:
            if self._pending:
                return self._pending[0].expires_at
        return now + self.ttl_seconds

    def pending(self) -> int:
        return len(self._pending)

    def _expire(self, due: Callable[[Seeded], bool], limit: int | None = None) -> int:
        expired = 0
        while limit is None or expired < limit:
            with self._lock:
                if not self._pending or not due(self._pending[0]):
                    break
                item = self._pending.popleft()
                if item.removed:
                    continue
                item.removed = True
            for keys in item.keys:
                self.index.evict_request_keys(keys, [item.entry])
            expired += 1
        return expired
