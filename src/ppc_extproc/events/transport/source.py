"""One event source: a publisher's sockets, sequence position and the messages held for it.

A source is one endpoint's publisher (per-endpoint mode) or one topic pod id (central mode). It is
owned by the ingestion thread; other threads only read its ``state`` (an ``IngestStats`` entry).
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from ppc_extproc.events.stats import SourceState
from ppc_extproc.ids import EndpointId

if TYPE_CHECKING:
    import zmq

    from ppc_extproc.events.transport.replay import ReplaySession

__all__ = ["EventEndpoint", "Held", "ReplayKind", "Source"]

class EventEndpoint(Protocol):
    """What the transport reads of a discovered endpoint (``framework.Endpoint`` is one); a
    protocol, so the events layer does not import the framework above it."""

    @property
    def id(self) -> EndpointId: ...

    @property
    def address(self) -> str: ...

    #: Data-parallel rank: its publisher listens on ``socketPort + rank``.
    @property
    def rank(self) -> int: ...


#: A live message held while its source replays: (topic, seq, payload).
Held = tuple[bytes, int, bytes]


class ReplayKind(enum.Enum):
    """Why a replay was requested."""

    #: From 0: first contact, engine restart, or a resync that could not be verified.
    FULL = "full"
    #: From ``last + 1``: messages were lost (HWM, a full queue).
    GAP = "gap"
    #: From ``last`` after a reconnect: is it the same publisher (same payload at ``last``)?
    VERIFY = "verify"


@dataclass(slots=True, eq=False)
class Source:
    """Mutable state of one source, touched by the ingestion thread only."""

    #: Index id of the events: the endpoint's ``ip:port`` (or the topic pod id in central mode).
    endpoint: str
    state: SourceState
    #: PUB address the SUB connects to ("" in central mode).
    address: str = ""
    #: Replay ROUTER address ("" ⇒ no replay for this source).
    replay_address: str = ""
    sub: zmq.Socket[bytes] | None = None
    monitor: zmq.Socket[bytes] | None = None
    #: Last topic frame seen (None: none yet), the model parsed from it, and whether it parsed.
    topic: bytes | None = None
    model: str = ""
    topic_ok: bool = True
    #: Last applied sequence number (None: nothing applied since start, clear or restart).
    last_seq: int | None = None
    #: Payload of ``last_seq``: compared with the replayed one to tell a restarted publisher.
    last_payload: bytes = b""
    #: Highest seq a replay applied; live copies up to it may still be in flight on the SUB
    #: (the two channels are not ordered) and are duplicates, not a restart. -1: none pending.
    replayed_to: int = -1
    #: Seq of the message whose gap was last counted (so a failed replay does not count twice).
    gap_counted_at: int = -1
    #: ``last_seq`` before each recent forward gap (bounded): the stream going on from one of
    #: them proves the messages that opened the later gaps were not this publisher's.
    before_gaps: list[int] = field(default_factory=list)
    #: Messages whose seq is implausible (backwards, or too far ahead), by seq, until a second
    #: signal confirms them (a restart or a long gap) or the stream going on refutes them.
    suspects: dict[int, Held] = field(default_factory=dict)
    #: Fingerprints of the recently applied messages by seq: a copy of one is a duplicate.
    recent: dict[int, tuple[int, bytes, bytes]] = field(default_factory=dict)
    #: A verify replay just proved ``last_seq`` is the publisher's: held suspects are refuted.
    verified: bool = False
    #: Live messages held while a replay runs (bounded by the queue size).
    held: deque[Held] = field(default_factory=deque)
    #: Held messages were dropped because ``held`` was full: resync when the replay ends.
    overflowed: bool = False
    replay: ReplaySession | None = None
    #: Gaps are only counted (no replay) until this monotonic time, after a failed replay.
    cooldown_until: float = 0.0
    #: The SUB connected at least once (a later handshake is a reconnect).
    connected_once: bool = False
    #: Socket (re)creation failed: retry at this monotonic time with ``backoff`` seconds.
    retry_at: float = 0.0
    backoff: float = 0.0
