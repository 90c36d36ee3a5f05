"""Stream positions restored from a warm-restart snapshot, waiting for their sources.

A loaded snapshot puts each endpoint's blocks back in the index, *suspended* (kept, not matched),
and leaves here its last seq and the payload at it. When discovery adds the endpoint again with
the same publisher addresses, its new source starts from that position as if its subscriber had
reconnected (``Ingestor.connected``): with a replay socket, a verify replay from ``last_seq``
decides — the engine still holds ``last_seq`` with the same payload ⇒ it replays the rest and the
part is exact; it no longer holds it (a gap beyond its buffer) or its counter is behind (a
restart) ⇒ the part is cleared and rebuilt from what the engine retains. Without replay the part
stays suspended until a live message proves it (the sequence rules of ``Ingestor``). A part whose
endpoint comes back with other addresses, or not within ``ttl``, is dropped.

Ingestion thread only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import structlog

from ppc_extproc.events.snapshot_format import EndpointPart

__all__ = ["RestoreTable"]

log = structlog.get_logger(__name__)


@dataclass(slots=True)
class RestoreTable:
    """Parts waiting for their source, and when unclaimed ones are dropped (monotonic)."""

    parts: dict[str, EndpointPart] = field(default_factory=dict)
    deadline: float = 0.0

    def take(self, endpoint: str) -> EndpointPart | None:
        return self.parts.pop(endpoint, None)

    def expired(self, now: float) -> list[str]:
        """Endpoints whose parts were never claimed, once the deadline passed (removed here)."""
        if not self.parts or now < self.deadline:
            return []
        gone = list(self.parts)
        self.parts.clear()
        log.info("warm_restart_parts_unclaimed", endpoints=len(gone))
        return gone
