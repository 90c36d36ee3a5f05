"""The warm-restart snapshot file: a fixed header, then one msgpack body.

Layout: ``MAGIC`` (8 bytes), format version (u32 LE), body length (u64 LE), sha256 of the body
(32 bytes), then the body (``IndexState`` in msgpack, by msgspec). A file is written to a
temporary name in the same directory, fsynced and renamed over the old one, so a reader sees the
old snapshot or the new one, never half of one. Reading checks, in order, the magic, the version,
the length against the file and the size cap, the checksum, the body's schema, and the
configuration hash, before anything is handed back: a snapshot is loaded whole or refused.
"""

from __future__ import annotations

import hashlib
import os
import struct
from pathlib import Path

import msgspec

__all__ = [
    "FORMAT_VERSION",
    "MAGIC",
    "EndpointPart",
    "IndexState",
    "SnapshotRefused",
    "read_snapshot",
    "write_snapshot",
]

MAGIC = b"PPCKVIX\x00"
#: Bumped whenever ``IndexState`` changes incompatibly.
FORMAT_VERSION = 1
_HEADER = struct.Struct("<8sIQ32s")


class SnapshotRefused(Exception):
    """The file is not a snapshot this process can load; ``reason`` is a short snake_case fact."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


class EndpointPart(msgspec.Struct, frozen=True, array_like=True):
    """One endpoint's identity and stream position, and the applier tables of its blocks."""

    endpoint: str
    #: PUB and replay ROUTER addresses the subscriber used ("" when unknown, central mode).
    address: str
    replay_address: str
    #: Last topic frame (its model segment is the hashing model of the events).
    topic: bytes
    last_seq: int
    #: Payload at ``last_seq``: a verify replay compares it with the engine's (same publisher?).
    last_payload: bytes
    #: (tier, group, uses) of each entry the endpoint owns, most used first.
    entries: list[tuple[str, int | None, int]]
    #: (group, kind, block size, sliding window) of each HMA group seen.
    groups: list[tuple[int, str, int, int | None]]
    #: (tier, group, dp rank, engine key, extra copies) reference counts of duplicate stores.
    duplicates: list[tuple[str, int | None, int, int, int]]
    #: Tokens per block of the engine's indexed group, as learned from its events (0: unknown).
    block_size: int = 0


class IndexState(msgspec.Struct, frozen=True):
    """Everything needed to rebuild the index exactly (speculative entries excluded)."""

    #: Hash of what makes request keys comparable: block size, hash seed and algorithm.
    config_hash: str
    created_unix: float
    parts: list[EndpointPart]
    #: Index entries as (endpoint, tier, group); masks refer to them by position.
    entries: list[tuple[str, str, int | None]]
    #: Distinct entry sets, as positions in ``entries``.
    masks: list[list[int]]
    #: Request keys (u64 LE) and, per key, the position of its mask (u32 LE), oldest first.
    request_keys: bytes
    mask_ids: bytes
    #: Scoped engine key → one request key (u64 LE pairs), oldest first.
    engine_keys: bytes
    engine_values: bytes
    #: Scoped engine keys that map to several request keys.
    engine_multi: list[tuple[int, list[int]]]


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(IndexState)


def write_snapshot(path: Path, state: IndexState, max_bytes: int) -> int:
    """Write ``state`` atomically to ``path``; returns the file size. Raises ``SnapshotRefused``
    ("too_large") without touching ``path`` when the body exceeds ``max_bytes``."""
    body = _encoder.encode(state)
    if len(body) > max_bytes:
        raise SnapshotRefused("too_large", f"{len(body)} bytes > {max_bytes}")
    header = _HEADER.pack(MAGIC, FORMAT_VERSION, len(body), hashlib.sha256(body).digest())
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(header)
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return _HEADER.size + len(body)


def read_snapshot(path: Path, max_bytes: int, config_hash: str) -> IndexState:
    """The snapshot at ``path``, fully checked; ``SnapshotRefused`` otherwise (``FileNotFoundError``
    when there is none)."""
    with open(path, "rb") as f:
        head = f.read(_HEADER.size)
        if len(head) < _HEADER.size:
            raise SnapshotRefused("truncated_header", f"{len(head)} bytes")
        magic, version, length, digest = _HEADER.unpack(head)
        if magic != MAGIC:
            raise SnapshotRefused("not_a_snapshot", "bad magic")
        if version != FORMAT_VERSION:
            raise SnapshotRefused("wrong_version", f"version {version}, expected {FORMAT_VERSION}")
        if length > max_bytes:
            raise SnapshotRefused("too_large", f"{length} bytes > {max_bytes}")
        body = f.read(length + 1)
    if len(body) != length:
        raise SnapshotRefused("wrong_length", f"{len(body)} bytes, header says {length}")
    if hashlib.sha256(body).digest() != digest:
        raise SnapshotRefused("bad_checksum")
    try:
        state = _decoder.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise SnapshotRefused("bad_body", str(exc)[:200]) from None
    if state.config_hash != config_hash:
        raise SnapshotRefused("foreign_config", f"config hash {state.config_hash}, expected {config_hash}")
    n_keys = len(state.request_keys)
    if n_keys % 8 or len(state.mask_ids) * 2 != n_keys or len(state.engine_keys) != len(state.engine_values) \
            or len(state.engine_keys) % 8:
        raise SnapshotRefused("bad_body", "array lengths disagree")
    n_entries = len(state.entries)
    if any(i < 0 or i >= n_entries for mask in state.masks for i in mask):
        raise SnapshotRefused("bad_body", "mask refers to an unknown entry")
    return state
