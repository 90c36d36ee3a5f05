"""llm-d's approximate-prefix block hashes (``prefixhash``), used by the approximate and burst
producers: content-locality keys, not the engine's block keys.

    parent = xxh64(model ‖ cache_salt)
    h_i    = xxh64(le64(xxh64(token bytes of block i)) ‖ le64(parent)); parent = h_i

The last block may be partial. Follows
``llm-d/llm-d-router: pkg/epp/framework/plugins/requestcontrol/dataproducer/prefixhash/``.
"""

from __future__ import annotations

import struct

import xxhash

__all__ = ["prefix_block_hashes"]

_PAIR = struct.Struct("<QQ")


def prefix_block_hashes(tokens: bytes, model: str, cache_salt: str | None, block_size: int, max_blocks: int) -> list[int]:
    """The hashes of one prompt (``tokens``: little-endian uint32 bytes), at most ``max_blocks``."""
    parent = xxhash.xxh64_intdigest(model.encode() + (cache_salt or "").encode())
    step = block_size * 4
    view = memoryview(tokens)
    out: list[int] = []
    digest = xxhash.xxh64_intdigest
    pack = _PAIR.pack
    for start in range(0, min(len(tokens), max_blocks * step), step):
        parent = digest(pack(digest(view[start : start + step]), parent))
        out.append(parent)
    return out
