"""Token ids as little-endian uint32 bytes: the form prompts travel in from parse to hash.

Keeping a prompt as bytes means the request path never materialises Python ints for it; the
hash chains in :mod:`ppc_extproc.blockkeys.hashing` read these bytes directly.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterator, Sequence
from typing import overload

__all__ = ["Le32Tokens", "le32_to_array", "tokens_to_le32"]

_BIG_ENDIAN_HOST = sys.byteorder == "big"


class Le32Tokens(Sequence[int]):
    """Token ids held as their little-endian uint32 bytes (``le32``), read as a sequence of ints.

    What the KV-event decoder gives ``BlockStored.token_ids`` when the engine's msgpack array
    converts straight to bytes: ingestion hashes ``le32`` without making an int per token."""

    __slots__ = ("le32",)

    def __init__(self, le32: bytes) -> None:
        if len(le32) % 4:
            raise ValueError("le32 token bytes must be a whole number of uint32 values")
        self.le32 = le32

    def __len__(self) -> int:
        return len(self.le32) >> 2

    @overload
    def __getitem__(self, index: int) -> int: ...
    @overload
    def __getitem__(self, index: slice) -> Le32Tokens: ...
    def __getitem__(self, index: int | slice) -> int | Le32Tokens:
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step == 1:
                return Le32Tokens(self.le32[start * 4 : max(start, stop) * 4])
            return Le32Tokens(tokens_to_le32(le32_to_array(self.le32)[index]))
        n = len(self)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError("token index out of range")
        return int.from_bytes(self.le32[index * 4 : index * 4 + 4], "little")

    def __iter__(self) -> Iterator[int]:
        return iter(le32_to_array(self.le32))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Le32Tokens):
            return self.le32 == other.le32
        if isinstance(other, Sequence) and not isinstance(other, (str, bytes, bytearray)):
            return len(other) == len(self) and list(le32_to_array(self.le32)) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # equal to lists, which do not hash

    def __repr__(self) -> str:
        return f"Le32Tokens({list(le32_to_array(self.le32))!r})"


def tokens_to_le32(token_ids: Sequence[int]) -> bytes:
    """Token ids as little-endian uint32 bytes. OverflowError/TypeError on values outside uint32."""
    if type(token_ids) is Le32Tokens:
        return token_ids.le32
    ids = array("I", token_ids)
    if _BIG_ENDIAN_HOST:  # pragma: no cover - no big-endian CI machine
        ids.byteswap()
    return ids.tobytes()


def le32_to_array(tokens_le32: bytes | memoryview) -> array[int]:
    """Little-endian uint32 bytes back to an ``array('I')`` of token ids."""
    ids = array("I")
    ids.frombytes(bytes(tokens_le32))
    if _BIG_ENDIAN_HOST:  # pragma: no cover
        ids.byteswap()
    return ids
