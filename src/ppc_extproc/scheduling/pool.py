"""The endpoint pool: the current set of serving endpoints, and the one owner of their lifecycle.

Discovery (static, file, Kubernetes) calls ``replace(endpoints)`` with the complete list; the pool
turns the difference into add / update / delete events and hands them to its subscribers — the
data layer's sources (``endpoint-notification-source`` → its extractors, such as the precise
producer's KV-event subscribers; ``metrics-data-source`` → its polls). Nothing else adds or
removes an endpoint. The request path asks for ``candidates(subset)``: every endpoint, or those
matching the data plane's subset hint.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence

import structlog

from ppc_extproc.framework import Endpoint, EndpointEvent, EndpointEventKind
from ppc_extproc.ids import EndpointId

__all__ = ["EndpointPool", "parse_endpoint_list"]

log = structlog.get_logger(__name__)


def parse_endpoint_list(text: str) -> list[Endpoint]:
    """``ip:port,ip:port,[ipv6]:port`` → endpoints. Raises ValueError naming the bad entry."""
    endpoints = []
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            continue
        host, sep, port = item.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"endpoint {item!r} is not ip:port")
        endpoints.append(Endpoint(host.strip("[]"), int(port), name=item))
    return endpoints


def _subset_matcher(subset: Sequence[str]) -> Callable[[Endpoint], bool]:
    """Match by IP, the port stripped, as llm-d's ``requestcontrol/candidates.go`` ``Locate`` does.

    A hint names a pod (``ip:port`` of any of its ports, or a bare IP); every endpoint of that IP
    matches. ``[v6]:port`` and bare IPv6 addresses are understood too.
    """
    hosts: set[str] = set()
    for raw in subset:
        for item in str(raw).split(","):
            item = item.strip()
            if not item:
                continue
            if item.startswith("["):  # [v6]:port or [v6]
                hosts.add(item[1:].partition("]")[0])
            elif item.count(":") == 1:  # v4:port
                hosts.add(item.partition(":")[0])
            else:  # a bare IPv4 address or a bare IPv6 address
                hosts.add(item)
    return lambda e: e.address in hosts


class EndpointPool:
    """Thread-safe set of endpoints with change notifications."""

    def __init__(self) -> None:
        self._endpoints: dict[EndpointId, Endpoint] = {}
        self._listeners: list[Callable[[EndpointEvent], None]] = []
        self._lock = threading.Lock()
        self._synced = threading.Event()

    @property
    def synced(self) -> bool:
        """True once discovery has produced its first endpoint list (readiness)."""
        return self._synced.is_set()

    def subscribe(self, listener: Callable[[EndpointEvent], None]) -> None:
        """Call ``listener`` for every add / update / delete (and at once for known endpoints)."""
        with self._lock:
            self._listeners.append(listener)
            current = list(self._endpoints.values())
        for endpoint in current:
            listener(EndpointEvent(EndpointEventKind.ADDED, endpoint))

    def replace(self, endpoints: Iterable[Endpoint]) -> list[EndpointEvent]:
        """Make the pool equal to ``endpoints``; returns and dispatches the resulting events."""
        new = {e.id: e for e in endpoints}
        events: list[EndpointEvent] = []
        with self._lock:
            for eid, old in self._endpoints.items():
                if eid not in new:
                    events.append(EndpointEvent(EndpointEventKind.DELETED, old))
            for eid, endpoint in new.items():
                known = self._endpoints.get(eid)
                if known is None:
                    events.append(EndpointEvent(EndpointEventKind.ADDED, endpoint))
                elif known != endpoint:
                    events.append(EndpointEvent(EndpointEventKind.UPDATED, endpoint, known))
            self._endpoints = new
            listeners = list(self._listeners)
        self._synced.set()
        for event in events:
            log.info("endpoint_" + event.kind.name.lower(), endpoint=event.endpoint.id)
            for listener in listeners:
                try:
                    listener(event)
                except Exception:
                    log.exception("endpoint_listener_failed", endpoint=event.endpoint.id)
        return events

    def endpoints(self) -> list[Endpoint]:
        return list(self._endpoints.values())

    def get(self, endpoint_id: EndpointId) -> Endpoint | None:
        return self._endpoints.get(endpoint_id)

    def candidates(self, subset: Sequence[str] | None = None) -> list[Endpoint]:
        """All endpoints, or those the subset hint names (None = no hint; [] = nothing)."""
        endpoints = list(self._endpoints.values())
        if subset is None:
            return endpoints
        matches = _subset_matcher(subset)
        return [e for e in endpoints if matches(e)]

    def __len__(self) -> int:
        return len(self._endpoints)
