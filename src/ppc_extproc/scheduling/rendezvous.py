"""Rendezvous (highest-random-weight) hashing of a 64-bit key over endpoint ids: every replica
and process picks the same endpoint for a key, and removing an endpoint moves only its own keys."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from functools import lru_cache

__all__ = ["rendezvous", "text_key"]

_MASK64 = (1 << 64) - 1


@lru_cache(maxsize=4096)
def _endpoint_seed(endpoint: str) -> int:
    return int.from_bytes(hashlib.blake2b(endpoint.encode(), digest_size=8).digest(), "little")


def _mix64(x: int) -> int:
    """splitmix64's finaliser: every input bit moves every output bit."""
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def text_key(text: str) -> int:
    """A 64-bit key of ``text`` (e.g. a session id), the same in every process."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little")


def rendezvous(key: int, endpoints: Sequence[str]) -> str:
    """The endpoint of ``endpoints`` (non-empty) with the highest rendezvous weight for ``key``."""
    return max(endpoints, key=lambda ep: (_mix64((key ^ _endpoint_seed(ep)) & _MASK64), ep))
