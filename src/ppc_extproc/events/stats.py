"""Counters of the KV-event path, kept in one place for metrics and the debug API.

Written by the ingestion thread only; read at scrape time from other threads (reads of a dict
snapshot are safe under the GIL). Names are metric label values, never free text.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["IngestStats", "SourceState"]


@dataclass(slots=True)
class SourceState:
    """Live state of one event source (one endpoint's publisher, or one topic in central mode)."""

    endpoint: str
    address: str = ""
    last_seq: int | None = None
    last_message_monotonic: float | None = None
    #: Seconds between the batch's engine timestamp and its application, last batch.
    lag_seconds: float | None = None
    connected: bool = False
    replaying: bool = False
    queue_depth: int = 0
    #: The subscriber lost its connection and nothing since proved the index entries still hold.
    suspended: bool = False

    def to_json(self) -> dict[str, object]:
        return {
            "endpoint": self.endpoint,
            "address": self.address,
            "lastSeq": self.last_seq,
            "lagSeconds": self.lag_seconds,
            "connected": self.connected,
            "replaying": self.replaying,
            "queueDepth": self.queue_depth,
            "suspended": self.suspended,
        }


@dataclass
class IngestStats:
    """Counters per endpoint: events by kind, drops by reason, and transport happenings."""

    #: (endpoint, event kind) → events applied, e.g. ("10.0.0.1:8000", "BlockStored")
    events: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    #: (endpoint, reason) → events or messages dropped, e.g. ("…", "unknown_parent")
    dropped: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    #: (endpoint, name) → transport counters: messages, batches, blocks_stored, gaps, replays_ok, …
    transport: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    sources: dict[str, SourceState] = field(default_factory=dict)
    #: Endpoints whose index entries must not be trusted right now (see ``Ingestor``); the
    #: request path reads this set, the ingestion thread replaces it.
    suspended: frozenset[str] = frozenset()
    #: Tokens per block of each endpoint's indexed (full-attention) KV-cache group, learned from
    #: its BlockStored events; the request path reads it (one int per endpoint).
    block_sizes: dict[str, int] = field(default_factory=dict)
    #: Told ``(endpoint, connected)`` when a subscriber connects or loses its connection, on the
    #: ingestion thread (so it must be thread-safe): endpoint health hears it when it happens.
    on_connection: Callable[[str, bool], None] | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def event(self, endpoint: str, kind: str, n: int = 1) -> None:
        self.events[(endpoint, kind)] += n

    def drop(self, endpoint: str, reason: str, n: int = 1) -> None:
        self.dropped[(endpoint, reason)] += n

    def count(self, endpoint: str, name: str, n: int = 1) -> None:
        self.transport[(endpoint, name)] += n

    def source(self, endpoint: str) -> SourceState:
        state = self.sources.get(endpoint)
        if state is None:
            with self._lock:
                state = self.sources.setdefault(endpoint, SourceState(endpoint))
        return state

    def set_connected(self, state: SourceState, connected: bool) -> None:
        """A subscriber's connection changed (ingestion thread): record it, tell ``on_connection``."""
        with self._lock:  # ordered with ``report_connections``: the listener never hears a stale value last
            state.connected = connected
            listener = self.on_connection
            if listener is not None:
                listener(state.endpoint, connected)

    def report_connections(self) -> None:
        """Tell ``on_connection`` every source's connection again (a reconciliation, any thread)."""
        with self._lock:
            listener = self.on_connection
            if listener is not None:
                for endpoint, state in self.sources.items():
                    listener(endpoint, state.connected)

    def forget(self, endpoint: str) -> None:
        """Drop a deleted endpoint's live state (counters stay: they are monotonic)."""
        with self._lock:
            self.sources.pop(endpoint, None)
            self.block_sizes.pop(endpoint, None)
            self.suspended = self.suspended - {endpoint}

    def suspend(self, state: SourceState, suspended: bool) -> None:
        """Mark ``state``'s endpoint entries untrusted (or trusted again)."""
        if state.suspended == suspended:
            return
        state.suspended = suspended
        with self._lock:
            if suspended:
                self.suspended = self.suspended | {state.endpoint}
            else:
                self.suspended = self.suspended - {state.endpoint}

    def dropped_total(self, endpoint: str | None = None) -> int:
        return sum(n for (ep, _), n in list(self.dropped.items()) if endpoint in (None, ep))

    def snapshot(self) -> dict[str, object]:
        """Everything, as JSON-ready nested dicts keyed by endpoint."""
        out: dict[str, dict[str, object]] = {}
        for table, name in ((self.events, "events"), (self.dropped, "dropped"), (self.transport, "transport")):
            for (endpoint, key), n in list(table.items()):
                section = out.setdefault(endpoint, {}).setdefault(name, {})
                assert isinstance(section, dict)
                section[key] = n
        for endpoint, state in list(self.sources.items()):
            out.setdefault(endpoint, {})["source"] = state.to_json()
        return dict(out)
