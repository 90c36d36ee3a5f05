"""The local session binding table: session id → endpoint, bounded (LRU) and expiring (TTL).

    table = BindingTable(max_bindings=65_536, ttl_seconds=300.0, clock=time.monotonic)
    table.bind("s-1", EndpointId("10.0.0.1:8000"))
    table.get("s-1")        # the endpoint, and the binding's TTL is refreshed
    table.sweep()           # drop expired bindings (also done lazily on read)

The table is keyed by client input (the session header), so it is bounded: past ``max_bindings``
the least recently used binding goes (Dynamo bounds its session map to 65,536 entries; llm-d's
map only expires). A binding unused for ``ttl_seconds`` expires (llm-d's ``evictionTtlSeconds``).
Over-long ids are reduced to a digest (``session_key``), so one client cannot make entries big.
"""

from __future__ import annotations

import hashlib
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from ppc_extproc.ids import EndpointId

__all__ = ["MAX_SESSION_ID_CHARS", "Binding", "BindingTable", "session_key"]

#: Longer session ids are keyed by their digest.
MAX_SESSION_ID_CHARS = 128


def session_key(session_id: str) -> str:
    """The table's (and the store's) key of ``session_id``: itself, or a digest when over-long."""
    if len(session_id) <= MAX_SESSION_ID_CHARS:
        return session_id
    return "sha256:" + hashlib.sha256(session_id.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(slots=True)
class Binding:
    """Where a session is pinned, and when the pin was last used (the table's clock)."""

    endpoint: EndpointId
    last_seen: float


class BindingTable:
    """Bounded, expiring session → endpoint bindings, with a count of bindings per endpoint."""

    def __init__(
        self, *, max_bindings: int = 65_536, ttl_seconds: float = 300.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if max_bindings < 1 or ttl_seconds <= 0:
            raise ValueError("max_bindings must be ≥ 1 and ttl_seconds > 0")
        self.max_bindings = max_bindings
        self.ttl_seconds = ttl_seconds
        self.clock = clock
        self._bindings: OrderedDict[str, Binding] = OrderedDict()
        self._per_endpoint: Counter[EndpointId] = Counter()
        #: Bindings dropped for room (LRU) and for age (TTL), since start.
        self.evicted = 0
        self.expired = 0

    def __len__(self) -> int:
        return len(self._bindings)

    def get(self, session: str) -> EndpointId | None:
        """The endpoint ``session`` is bound to (refreshing its TTL and recency), or None."""
        key = session_key(session)
        binding = self._bindings.get(key)
        if binding is None:
            return None
        now = self.clock()
        if now - binding.last_seen > self.ttl_seconds:
            self._drop(key, binding)
            self.expired += 1
            return None
        binding.last_seen = now
        self._bindings.move_to_end(key)
        return binding.endpoint

    def peek(self, session: str) -> EndpointId | None:
        """The bound endpoint without refreshing anything (expired bindings read as None)."""
        binding = self._bindings.get(session_key(session))
        if binding is None or self.clock() - binding.last_seen > self.ttl_seconds:
            return None
        return binding.endpoint

    def bind(self, session: str, endpoint: EndpointId) -> None:
        """Pin ``session`` to ``endpoint`` (a new binding, a refresh, or a move)."""
        key = session_key(session)
        now = self.clock()
        binding = self._bindings.get(key)
        if binding is not None:
            if binding.endpoint != endpoint:
                self._uncount(binding.endpoint)
                self._per_endpoint[endpoint] += 1
                binding.endpoint = endpoint
            binding.last_seen = now
            self._bindings.move_to_end(key)
            return
        self._bindings[key] = Binding(endpoint, now)
        self._per_endpoint[endpoint] += 1
        while len(self._bindings) > self.max_bindings:
            old_key, old = next(iter(self._bindings.items()))
            self._drop(old_key, old)
            self.evicted += 1

    def unbind(self, session: str) -> None:
        key = session_key(session)
        binding = self._bindings.get(key)
        if binding is not None:
            self._drop(key, binding)

    def bindings_of(self, endpoint: EndpointId) -> int:
        """Live-or-not-yet-swept bindings to ``endpoint`` (placement reads this)."""
        return self._per_endpoint.get(endpoint, 0)

    def per_endpoint(self) -> dict[EndpointId, int]:
        return dict(self._per_endpoint)

    def sweep(self) -> int:
        """Drop every expired binding; returns how many. Oldest-used first, so it stops at the
        first live one."""
        deadline = self.clock() - self.ttl_seconds
        dropped = 0
        while self._bindings:
            key, binding = next(iter(self._bindings.items()))
            if binding.last_seen >= deadline:
                break
            self._drop(key, binding)
            dropped += 1
        self.expired += dropped
        return dropped

    def _drop(self, key: str, binding: Binding) -> None:
        del self._bindings[key]
        self._uncount(binding.endpoint)

    def _uncount(self, endpoint: EndpointId) -> None:
        left = self._per_endpoint[endpoint] - 1
        if left > 0:
            self._per_endpoint[endpoint] = left
        else:
            del self._per_endpoint[endpoint]
