"""Warm restart: snapshot the index with every endpoint's stream position, and load it back.

``take_snapshot`` runs on the ingestion thread (``ZmqTransport.on_thread``), so the blocks and the
last applied seq of every source are one consistent cut. ``load_snapshot`` runs before the
transport starts: it checks the whole file first (``snapshot_format``), then adds the blocks of
every endpoint that has a position, suspended, and leaves the positions in the transport's
``RestoreTable`` (``events/transport/restore.py`` says what proves or drops each part).
``SnapshotWriter`` writes one periodically from its own thread, and once more on stop.
"""

from __future__ import annotations

import hashlib
import threading
import time
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import structlog

from ppc_extproc.blockkeys import TokenProcessorConfig
from ppc_extproc.events.apply import EventApplier
from ppc_extproc.events.snapshot_format import (
    EndpointPart,
    IndexState,
    SnapshotRefused,
    read_snapshot,
    write_snapshot,
)
from ppc_extproc.events.stats import IngestStats
from ppc_extproc.ids import EndpointId
from ppc_extproc.index import PodEntry
from ppc_extproc.index.memory import IndexBlocks

if TYPE_CHECKING:
    from ppc_extproc.events.transport.restore import RestoreTable
    from ppc_extproc.events.transport.source import Source

__all__ = ["SNAPSHOT_FILE", "LoadResult", "SnapshotWriter", "config_hash", "load_snapshot", "take_snapshot"]

log = structlog.get_logger(__name__)

#: File name of the snapshot inside the state directory.
SNAPSHOT_FILE = "kv-index.snapshot"


def config_hash(config: TokenProcessorConfig) -> str:
    """What makes request keys comparable between two processes."""
    text = f"{config.block_size_tokens}|{config.hash_algorithm}|{config.hash_seed}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def take_snapshot(applier: EventApplier, sources: list[Source], hash_: str) -> IndexState:
    """The index and every positioned source's identity and tables (ingestion thread)."""
    parts = []
    for src in sources:
        if src.last_seq is None:
            continue
        entries, groups, duplicates = applier.export_tables(src.endpoint)
        parts.append(
            EndpointPart(
                src.endpoint, src.address, src.replay_address, src.topic or b"", src.last_seq,
                src.last_payload, entries, groups, duplicates, applier.stats.block_sizes.get(src.endpoint, 0),
            )
        )
    blocks = applier.index.export_blocks()
    return IndexState(
        config_hash=hash_,
        created_unix=time.time(),
        parts=parts,
        entries=[(e.endpoint, e.tier, e.group) for e in blocks.entries],
        masks=blocks.masks,
        request_keys=_bytes(blocks.request_keys, "Q"),
        mask_ids=_bytes(blocks.mask_ids, "I"),
        engine_keys=_bytes(blocks.engine_keys, "Q"),
        engine_values=_bytes(blocks.engine_values, "Q"),
        engine_multi=blocks.engine_multi,
    )


def _bytes(values: Sequence[int], code: Literal["I", "Q"]) -> bytes:
    return values.tobytes() if isinstance(values, array) else array(code, values).tobytes()


@dataclass(frozen=True, slots=True)
class LoadResult:
    endpoints: int
    request_keys: int
    seconds: float


def load_snapshot(
    path: Path,
    max_bytes: int,
    hash_: str,
    applier: EventApplier,
    stats: IngestStats,
    restored: RestoreTable,
    ttl_seconds: float,
    clock: Callable[[], float] = time.monotonic,
) -> LoadResult | None:
    """Load ``path`` into an empty index; None (one log line) when there is none or it is refused."""
    started = time.perf_counter()
    try:
        state = read_snapshot(path, max_bytes, hash_)
        blocks = _blocks(state)
    except FileNotFoundError:
        log.info("warm_restart_no_snapshot", path=str(path))
        return None
    except (SnapshotRefused, OSError) as exc:
        reason = exc.reason if isinstance(exc, SnapshotRefused) else "unreadable"
        log.warning("warm_restart_snapshot_refused", path=str(path), reason=reason, detail=str(exc)[:300])
        return None
    applier.index.import_blocks(blocks)
    for part in state.parts:
        applier.import_tables(part.endpoint, part.entries, part.groups, part.duplicates)
        stats.suspend(stats.source(part.endpoint), True)
        if part.block_size > 0:
            stats.block_sizes[part.endpoint] = part.block_size
        restored.parts[part.endpoint] = part
    restored.deadline = clock() + ttl_seconds
    result = LoadResult(len(state.parts), len(blocks.request_keys), time.perf_counter() - started)
    log.info(
        "warm_restart_snapshot_loaded", path=str(path), endpoints=result.endpoints,
        request_keys=result.request_keys, seconds=round(result.seconds, 3),
    )
    return result


def _blocks(state: IndexState) -> IndexBlocks:
    """The index blocks of the endpoints that have a position; ``SnapshotRefused`` when the
    arrays disagree (checked before anything is loaded)."""
    positioned = {p.endpoint for p in state.parts}
    keep = [i for i, (endpoint, _, _) in enumerate(state.entries) if endpoint in positioned]
    renumber = {old: new for new, old in enumerate(keep)}
    entries = [PodEntry(EndpointId(e), tier, group=g) for e, tier, g in (state.entries[i] for i in keep)]
    masks = [[renumber[i] for i in m if i in renumber] for m in state.masks]
    keys = array("Q")
    keys.frombytes(state.request_keys)
    ids = array("I")
    ids.frombytes(state.mask_ids)
    if ids and max(ids) >= len(masks):
        raise SnapshotRefused("bad_body", "key refers to an unknown entry set")
    if any(not m for m in masks):  # entries of unpositioned endpoints: drop keys left empty
        kept = [(k, i) for k, i in zip(keys, ids) if masks[i]]
        keys, ids = array("Q", [k for k, _ in kept]), array("I", [i for _, i in kept])
    engine_keys = array("Q")
    engine_keys.frombytes(state.engine_keys)
    engine_values = array("Q")
    engine_values.frombytes(state.engine_values)
    return IndexBlocks(entries, masks, keys, ids, engine_keys, engine_values, state.engine_multi)


class SnapshotWriter:
    """Writes the snapshot every ``interval_seconds`` from its own thread, and on ``stop``."""

    def __init__(
        self,
        path: Path,
        interval_seconds: float,
        max_bytes: int,
        build: Callable[[], IndexState | None],
    ) -> None:
        self.path = path
        self.interval_seconds = interval_seconds
        self.max_bytes = max_bytes
        self._build = build
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        #: Snapshots written since start (a test and debug fact).
        self.written = 0

    def start(self) -> None:
        if self._thread is None and self.interval_seconds > 0:
            self._thread = threading.Thread(target=self._run, name="kv-snapshot", daemon=True)
            self._thread.start()

    def stop(self, final: bool = True) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(10.0)
        if final:
            self.write_now()

    def write_now(self) -> bool:
        """Build and write one snapshot; False (logged) when it could not be."""
        with self._lock:
            started = time.perf_counter()
            try:
                state = self._build()
                if state is None:
                    return False
                size = write_snapshot(self.path, state, self.max_bytes)
            except SnapshotRefused as exc:
                log.warning("warm_restart_snapshot_skipped", reason=exc.reason, detail=exc.detail)
                return False
            except Exception:  # the thread's boundary: log and keep the previous file
                log.warning("warm_restart_snapshot_failed", path=str(self.path), exc_info=True)
                return False
            self.written += 1
            log.info(
                "warm_restart_snapshot_written", path=str(self.path), bytes=size,
                endpoints=len(state.parts), request_keys=len(state.request_keys) // 8,
                seconds=round(time.perf_counter() - started, 3),
            )
            return True

    def _run(self) -> None:
        while not self._stopping.wait(self.interval_seconds):
            self.write_now()
