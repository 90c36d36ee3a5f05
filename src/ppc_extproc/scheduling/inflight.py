"""In-flight requests and tokens per endpoint, tracked by this service (llm-d's in-flight load
producer; local to this replica): a request counts from routing to the end of its response, its
uncached prompt tokens from routing to the response's first byte."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from ppc_extproc.ids import EndpointId

__all__ = ["InflightTracker"]


@dataclass(slots=True)
class _Started:
    endpoint: EndpointId
    tokens: int
    started_at: float


class InflightTracker:
    """Counts requests and uncached prompt tokens per endpoint. Bounded: a request never finished
    (a leak elsewhere) is dropped after ``max_age_seconds``; at most ``max_requests`` are tracked."""

    def __init__(
        self,
        *,
        max_requests: int = 100_000,
        max_age_seconds: float = 3600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_requests = max_requests
        self.max_age_seconds = max_age_seconds
        self.clock = clock
        self._requests: dict[str, _Started] = {}
        self._count: dict[EndpointId, int] = {}
        self._tokens: dict[EndpointId, int] = {}
        self._lock = threading.Lock()

    def start(self, request_id: str, endpoint: EndpointId, tokens: int = 0) -> None:
        with self._lock:
            if request_id in self._requests:
                self._finish_locked(request_id)
            if len(self._requests) >= self.max_requests:
                self._finish_locked(next(iter(self._requests)))
            self._requests[request_id] = _Started(endpoint, tokens, self.clock())
            self._count[endpoint] = self._count.get(endpoint, 0) + 1
            self._tokens[endpoint] = self._tokens.get(endpoint, 0) + tokens

    def release_tokens(self, request_id: str) -> None:
        """The response's first byte: prefill is done, so its prompt tokens stop counting; the
        request itself stays in flight until ``finish`` (llm-d's ``inflight-load-producer``,
        ``releaseTokensEarly``). O(1), idempotent."""
        with self._lock:
            started = self._requests.get(request_id)
            if started is None or not started.tokens:
                return
            ep = started.endpoint
            self._tokens[ep] = self._tokens.get(ep, 0) - started.tokens
            started.tokens = 0

    def finish(self, request_id: str) -> bool:
        """End a request (idempotent). True if it was in flight."""
        with self._lock:
            return self._finish_locked(request_id)

    def requests(self, endpoint: EndpointId) -> int:
        return self._count.get(endpoint, 0)

    def tokens(self, endpoint: EndpointId) -> int:
        return self._tokens.get(endpoint, 0)

    def snapshot(self) -> dict[str, dict[str, int]]:
        with self._lock:
            return {ep: {"requests": n, "tokens": self._tokens.get(ep, 0)} for ep, n in self._count.items()}

    def expire(self) -> int:
        """Drop requests older than ``max_age_seconds``. Returns how many."""
        deadline = self.clock() - self.max_age_seconds
        with self._lock:
            stale = [rid for rid, s in self._requests.items() if s.started_at < deadline]
            for rid in stale:
                self._finish_locked(rid)
        return len(stale)

    def __len__(self) -> int:
        return len(self._requests)

    def _finish_locked(self, request_id: str) -> bool:
        started = self._requests.pop(request_id, None)
        if started is None:
            return False
        ep = started.endpoint
        count = self._count.get(ep, 0) - 1
        tokens = self._tokens.get(ep, 0) - started.tokens
        if count <= 0:
            self._count.pop(ep, None)
            self._tokens.pop(ep, None)
        else:
            self._count[ep] = count
            self._tokens[ep] = tokens
        return True
