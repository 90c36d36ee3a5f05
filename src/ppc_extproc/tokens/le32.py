"""Token ids as little-endian uint32 bytes: the form prompts travel in from parse to hash.

Keeping a prompt as bytes means the request path never materialises Python ints for it; the
hash chains in :mod:`ppc_extproc.blockkeys.hashing` read these bytes directly.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Sequence

__all__ = ["le32_to_array", "tokens_to_le32"]

_BIG_ENDIAN_HOST = sys.byteorder == "big"


def tokens_to_le32(token_ids: Sequence[int]) -> bytes:
    """Token ids as little-endian uint32 bytes. OverflowError/TypeError on values outside uint32."""
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
