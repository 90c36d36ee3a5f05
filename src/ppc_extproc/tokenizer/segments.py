"""Per-piece token cache: text cut at added tokens, each piece's ids cached by content hash.

``tokenizers`` encodes the pieces between added tokens independently (see ``hf.py``), so a shared
system prompt, a RAG context or the earlier turns of a conversation — each a run of pieces between
role markers — are tokenized once and then only looked up. Keys are
``(tokenizer fingerprint, piece starts at offset 0, xxh3-128 of the piece's UTF-8)``; values are
the piece's little-endian uint32 ids. The cache is an LRU bounded in bytes (keys, values and a
fixed per-entry overhead); it is safe to share between threads and between tokenizers.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import xxhash

from ppc_extproc.tokenizer.hf import HfTokenizer

__all__ = ["DEFAULT_CACHE_BYTES", "CacheStats", "SegmentCache", "encode_text"]

#: Default budget: about 16M cached tokens.
DEFAULT_CACHE_BYTES = 64 * 1024 * 1024
#: Bytes charged per entry on top of key and value (dict slot, OrderedDict links, bytes headers).
ENTRY_OVERHEAD_BYTES = 160
#: Pieces shorter than this (UTF-8 bytes) are encoded on every request (hashing would cost as much).
MIN_CACHED_BYTES = 16


@dataclass(frozen=True, slots=True)
class CacheStats:
    """Counters of a :class:`SegmentCache` (read them, do not mutate)."""

    hits: int
    misses: int
    evictions: int
    entries: int
    bytes: int
    max_bytes: int


class SegmentCache:
    """Bounded LRU of piece → LE32 ids, sized in bytes."""

    def __init__(self, max_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        if max_bytes < 0:
            raise ValueError("max_bytes must be >= 0")
        self.max_bytes = max_bytes
        self._data: OrderedDict[bytes, bytes] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self._hits = self._misses = self._evictions = 0

    @staticmethod
    def key(fingerprint: bytes, first: bool, utf8: bytes | memoryview) -> bytes:
        """Cache key of a piece (its UTF-8 bytes)."""
        return fingerprint + (b"\x01" if first else b"\x00") + xxhash.xxh3_128_digest(utf8)

    def get_many(self, keys: list[bytes]) -> list[bytes | None]:
        """Values for ``keys`` (None where absent); hits move to the young end."""
        out: list[bytes | None] = []
        with self._lock:
            data = self._data
            for k in keys:
                v = data.get(k)
                if v is None:
                    self._misses += 1
                else:
                    self._hits += 1
                    data.move_to_end(k)
                out.append(v)
        return out

    def put_many(self, items: list[tuple[bytes, bytes]]) -> None:
        """Insert entries, evicting the least recently used ones beyond the budget."""
        with self._lock:
            data = self._data
            for k, v in items:
                cost = len(k) + len(v) + ENTRY_OVERHEAD_BYTES
                if cost > self.max_bytes:
                    continue  # larger than the whole budget: never cached
                old = data.pop(k, None)
                if old is not None:
                    self._bytes -= len(k) + len(old) + ENTRY_OVERHEAD_BYTES
                data[k] = v
                self._bytes += cost
            while self._bytes > self.max_bytes:
                k, v = data.popitem(last=False)
                self._bytes -= len(k) + len(v) + ENTRY_OVERHEAD_BYTES
                self._evictions += 1

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self._bytes = 0

    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(self._hits, self._misses, self._evictions, len(self._data), self._bytes, self.max_bytes)


def encode_text(tok: HfTokenizer, text: str, *, add_special_tokens: bool, cache: SegmentCache | None) -> bytes:
    """LE32 ids of ``text``, identical to ``tok.encode_ids(text, add_special_tokens=...)``.

    Pieces are looked up in ``cache`` and only missing ones are encoded (in one batch). Without a
    cache, or when per-piece encoding would not be exact (a rejected ``single_word`` candidate, no
    sentinel token, a post-processor that is not a constant prefix/suffix), the whole text is
    encoded at once.
    """
    specials = tok.special_ids(add_special_tokens)
    if cache is None or specials is None or not tok.piecewise:
        return _whole(tok, text, add_special_tokens)
    data = text.encode("utf-8", "surrogatepass")
    pieces, rejected = tok.splitter.split(data)
    if rejected:
        return _whole(tok, text, add_special_tokens)
    prefix, suffix = specials
    out: list[bytes] = [prefix]
    fp = tok.fingerprint
    view = memoryview(data)
    lookups: list[tuple[int, int, int, bytes]] = []  # (slot in out, start, end, key)
    misses: list[tuple[int, int, int, bytes]] = []
    for p in pieces:
        if p.token_id is not None:
            out.append(p.token_id.to_bytes(4, "little"))
            continue
        out.append(b"")
        if p.end - p.start < MIN_CACHED_BYTES:
            misses.append((len(out) - 1, p.start, p.end, b""))
        else:
            lookups.append((len(out) - 1, p.start, p.end, SegmentCache.key(fp, p.start == 0, view[p.start : p.end])))
    if lookups:
        for entry, value in zip(lookups, cache.get_many([e[3] for e in lookups])):
            if value is None:
                misses.append(entry)
            else:
                out[entry[0]] = value
    if misses:
        encoded = tok.encode_pieces([(data[s:e].decode("utf-8", "surrogatepass"), s == 0) for _, s, e, _ in misses])
        new: list[tuple[bytes, bytes]] = []
        for (slot, _, _, key), ids in zip(misses, encoded):
            out[slot] = ids
            if key:
                new.append((key, ids))
        if new:
            cache.put_many(new)
    out.append(suffix)
    return b"".join(out)


def _whole(tok: HfTokenizer, text: str, add_special_tokens: bool) -> bytes:
    return np.asarray(tok.backend.encode(text, add_special_tokens=add_special_tokens).ids, dtype="<u4").tobytes()
