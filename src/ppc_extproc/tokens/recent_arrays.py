"""The token arrays of recent long request bodies, so that a body whose array begins as one of
theirs did (the next turn of a conversation, a retry, a sibling request) is read from where the two
differ instead of from its start.

    RecentTokenArrays().read(body, pos)   # == native.json_uint32_array(body, pos), for any body

The bytes of the two arrays are compared up to the first difference (``native.common_prefix``).
The tokens before the last comma ahead of it are the recent array's tokens; what follows that comma
is read as an array of its own, so it is checked by the same scan. When nothing follows (a comma
before ``]``, which is not JSON) or the scan refuses it, the whole body is read as usual, and the
usual scan refuses it. Byte-identical arrays take the recent tokens as they are.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from ppc_extproc import native

__all__ = ["RECENT_ARRAYS", "RecentTokenArrays"]

#: Bodies shorter than this after the array's '[' are read without looking here.
MIN_BYTES = 64 * 1024
_COMMA = ord(",")
#: Bytes after the '[' that name an entry: two arrays that differ in them share too little.
_HEAD_BYTES = 64


@dataclass(frozen=True, slots=True)
class _Array:
    body: bytes
    #: Index of the array's '[' and of its ']' in ``body``.
    start: int
    end: int
    #: The array's values as little-endian uint32 bytes.
    tokens: bytes


class RecentTokenArrays:
    """Recent arrays by their first bytes, least recently read evicted first. Bounded by count and
    by the bytes it keeps alive (bodies and token arrays). Thread-safe."""

    def __init__(self, max_arrays: int = 16, max_bytes: int = 64 << 20, min_bytes: int = MIN_BYTES) -> None:
        self.max_arrays = max_arrays
        self.max_bytes = max_bytes
        self.min_bytes = min_bytes
        self._arrays: OrderedDict[bytes, _Array] = OrderedDict()
        self._held = 0
        self._lock = threading.Lock()
        #: Reads that reused a recent array (a metric for tests and benchmarks).
        self.reused = 0

    def read(self, body: bytes | bytearray | memoryview, pos: int) -> tuple[bytes, int] | None:
        """``native.json_uint32_array(body, pos)``: the array's le32 bytes and the index of its
        ']', or None for anything but a flat array of uint32 values."""
        if type(body) is not bytes or len(body) - pos < self.min_bytes:  # only immutable bodies are kept
            return native.json_uint32_array(body, pos)
        head = body[pos : pos + _HEAD_BYTES]
        with self._lock:
            recent = self._arrays.get(head)
        found = self._reuse(recent, body, pos) if recent is not None else None
        if found is None:
            found = native.json_uint32_array(body, pos)
        if found is not None:  # this body becomes the newest entry of its head
            self._keep(head, _Array(body, pos, found[1], found[0]))
        return found

    def _reuse(self, recent: _Array, body: bytes, pos: int) -> tuple[bytes, int] | None:
        same = native.common_prefix(body, pos, recent.body, recent.start)
        length = recent.end - recent.start
        if same > length:  # equal through the ']'
            self.reused += 1
            return recent.tokens, pos + length
        comma = recent.body.rfind(b",", recent.start, recent.start + same)
        # Reading the rest on its own copies it: worth it only when most of the array is shared.
        if comma < 0 or (comma - recent.start) * 4 < (len(body) - pos):
            return None
        rest_at = pos + (comma - recent.start) + 1  # in body, the first byte after that comma
        rest = native.json_uint32_array(b"[" + body[rest_at:], 0)
        if rest is None or not rest[0]:  # "[1,]" is not an array: the whole read refuses it
            return None
        # Commas before that one, counted vectorised (bytes.count loops a byte at a time).
        shared = int(np.count_nonzero(np.frombuffer(recent.body, np.uint8, comma - recent.start, recent.start) == _COMMA)) + 1
        self.reused += 1
        return recent.tokens[: 4 * shared] + rest[0], rest_at - 1 + rest[1]

    def _keep(self, head: bytes, array: _Array) -> None:
        size = len(array.body) + len(array.tokens)
        if size > self.max_bytes:
            return
        with self._lock:
            old = self._arrays.pop(head, None)
            if old is not None:
                self._held -= len(old.body) + len(old.tokens)
            self._arrays[head] = array
            self._held += size
            while len(self._arrays) > self.max_arrays or self._held > self.max_bytes:
                _, dropped = self._arrays.popitem(last=False)
                self._held -= len(dropped.body) + len(dropped.tokens)


#: The request path's arrays (``tokens.body.sentinel_parse``).
RECENT_ARRAYS = RecentTokenArrays()
