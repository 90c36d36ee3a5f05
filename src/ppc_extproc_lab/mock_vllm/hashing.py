"""vLLM's prefix-cache block hashing, ``sha256`` algorithm (``vllm-project/vllm: vllm/v1/core/kv_cache_utils.py``).

``hash_block_tokens(parent, tokens, extra_keys) = sha256(pickle((parent or NONE_HASH,
tuple(tokens), extra_keys)))``, full blocks only, with ``NONE_HASH = sha256(pickle(seed))``
and vLLM 0.29+'s default seed ``"vllm-none-hash"``. The event carries the last 8 bytes of the
digest as a big-endian unsigned int.

``cache_salt`` (vLLM 0.31+): the block that starts at token 0 hashes the extra key
``("cache_salt", salt)``; the event's ``extra_keys`` entry for it is the untagged ``(salt,)``.
This reproduces the spec's salted block-0 value ``0x21d3c263a7fc0a47`` for tokens 1..16.
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Sequence
from typing import Any, Final

__all__ = [
    "DEFAULT_NONE_HASH_SEED",
    "BlockHasher",
    "block_extra_keys",
    "event_extra_keys",
    "wire_hash",
]

#: vLLM 0.29+ seed of ``NONE_HASH`` when ``PYTHONHASHSEED`` is unset (sha256 algorithms).
DEFAULT_NONE_HASH_SEED: Final = "vllm-none-hash"

_MASK64: Final = (1 << 64) - 1


def _sha256(obj: Any) -> bytes:
    return hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def wire_hash(digest: bytes) -> int:
    """The event form of a block digest: last 8 bytes, big-endian unsigned (vLLM 0.10.2+)."""
    return int.from_bytes(digest, "big") & _MASK64


def block_extra_keys(block_index: int, cache_salt: str | None) -> tuple[Any, ...] | None:
    """Hash-input extra keys of block ``block_index`` (vLLM 0.31+ tagged salt form)."""
    if cache_salt is not None and block_index == 0:
        return (("cache_salt", cache_salt),)
    return None


def event_extra_keys(block_index: int, cache_salt: str | None) -> tuple[Any, ...] | None:
    """The ``extra_keys`` entry a BlockStored event carries for block ``block_index`` (untagged)."""
    if cache_salt is not None and block_index == 0:
        return (cache_salt,)
    return None


class BlockHasher:
    """Chained block digests of token sequences, as vLLM's ``hash_block_tokens``."""

    def __init__(self, block_size: int, none_hash_seed: str = DEFAULT_NONE_HASH_SEED) -> None:
        if block_size <= 0:
            raise ValueError("block_size must be positive")
        self.block_size = block_size
        self.none_hash: bytes = _sha256(none_hash_seed)

    def hash_block(
        self, parent: bytes | None, tokens: Sequence[int], extra_keys: tuple[Any, ...] | None
    ) -> bytes:
        """Digest of one full block chained on ``parent`` (None ⇒ ``NONE_HASH``)."""
        return _sha256((parent if parent else self.none_hash, tuple(tokens), extra_keys))

    def hash_blocks(
        self,
        tokens: Sequence[int],
        cache_salt: str | None = None,
        *,
        start_block: int = 0,
        parent: bytes | None = None,
    ) -> list[bytes]:
        """Digests of every full block of ``tokens`` from ``start_block`` on.

        ``parent`` must be the digest of block ``start_block - 1`` when ``start_block > 0``.
        """
        bs = self.block_size
        out: list[bytes] = []
        prev = parent
        for i in range(start_block, len(tokens) // bs):
            prev = self.hash_block(
                prev, tokens[i * bs : (i + 1) * bs], block_extra_keys(i, cache_salt)
            )
            out.append(prev)
        return out
