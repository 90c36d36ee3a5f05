"""In-flight requests and tokens per endpoint, tracked by this service (llm-d's in-flight load
producer): a request counts from routing to the end of its response, its uncached prompt tokens
from routing to the response's first byte. A cross-replica syncer adds the other replicas' counts
(``set_peer_load``); ``requests``/``tokens`` read local + peers, ``local_snapshot`` this replica's."""

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
        #: The other replicas' counts per endpoint (requests, tokens), as a syncer last saw them.
        self._peers: dict[EndpointId, tuple[int, int]] = {}
        #: Called after every local change (a syncer pushes this replica's counts); must be cheap.
        self.on_change: Callable[[], None] | None = None

    def set_peer_load(self, peers: dict[EndpointId, tuple[int, int]]) -> None:
        """Replace the other replicas' counts ({} when the shared store is unreachable)."""
        self._peers = peers

    def peer_load(self) -> dict[EndpointId, tuple[int, int]]:
        return self._peers

    def start(self, request_id: str, endpoint: EndpointId, tokens: int = 0) -> None:
        with self._lock:
            if request_id in self._requests:
                self._finish_locked(request_id)
            if len(self._requests) >= self.max_requests:
                self._finish_locked(next(iter(self._requests)))
            self._requests[request_id] = _Started(endpoint, tokens, self.clock())
            self._count[endpoint] = self._count.get(endpoint, 0) + 1
            self._tokens[endpoint] = self._tokens.get(endpoint, 0) + tokens
        if self.on_change is not None:
            self.on_change()

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
        if self.on_change is not None:
            self.on_change()

    def finish(self, request_id: str) -> bool:
        """End a request (idempotent). True if it was in flight."""
        with self._lock:
            finished = self._finish_locked(request_id)
        if finished and self.on_change is not None:
            self.on_change()
        return finished

    def requests(self, endpoint: EndpointId) -> int:
        """Requests in flight on ``endpoint``: this replica's plus the other replicas'."""
        peer = self._peers.get(endpoint)
        return self._count.get(endpoint, 0) + (peer[0] if peer is not None else 0)

    def tokens(self, endpoint: EndpointId) -> int:
        peer = self._peers.get(endpoint)
        return self._tokens.get(endpoint, 0) + (peer[1] if peer is not None else 0)

    def local_snapshot(self) -> dict[EndpointId, tuple[int, int]]:
        """This replica's own (requests, tokens) per endpoint."""
        with self._lock:
            return {ep: (n, self._tokens.get(ep, 0)) for ep, n in self._count.items()}

    def snapshot(self) -> dict[str, dict[str, int]]:
        """Per endpoint: this replica's requests and tokens, and (with a syncer) the other replicas'."""
        with self._lock:
            out: dict[str, dict[str, int]] = {ep: {"requests": n, "tokens": self._tokens.get(ep, 0)} for ep, n in self._count.items()}
        for ep, (n, t) in self._peers.items():
            counts = out.setdefault(ep, {"requests": 0, "tokens": 0})
            counts["peer_requests"], counts["peer_tokens"] = n, t
        return out

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
