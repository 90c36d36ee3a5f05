"""llm-d's two request-key hash chains, byte-exact.

``xxh64``:    key = XXH64(LE64(parent) ‖ LE32(t0) ‖ … ‖ for s in extras: LE64(len(s)) ‖ s), seed 0
``cbor-fnv``: key = FNV-1a-64(canonical CBOR [parent, [t0, …], extras]) with extras
              ``null``, the model name (root only) or ``[{"Hash": s}, …]``

Both take the tokens of a prompt as little-endian uint32 bytes, so the request path never has to
turn token ids into Python ints (the cbor-fnv chain does, per block: it is the slow interoperability
option, unless the C extension is built). Follows ``llm-d/llm-d-router: pkg/kvcache/kvblock/token_processor.go``; the test vectors in
``tests/fixtures/vectors/llmd_hash_vectors.json`` pin both chains.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Protocol

import xxhash

from ppc_extproc import native
from ppc_extproc.tokens.le32 import le32_to_array

__all__ = [
    "BlockExtras",
    "CborFnvHasher",
    "Hasher",
    "XXH64Hasher",
    "hasher_for",
]

#: Per-block identifier strings (multimodal ids, then ``cache_salt`` on block 0), or None.
BlockExtras = Sequence[str] | None

_xxh64 = xxhash.xxh64_intdigest
_LE64 = struct.Struct("<Q").pack


class Hasher(Protocol):
    """One hash algorithm of llm-d's token processor."""

    name: str

    def init_hash(self, seed: str) -> int: ...

    def root(self, init_hash: int, model: str) -> int: ...

    def chain(
        self,
        parent: int,
        tokens_le32: bytes | memoryview,
        block_size: int,
        n_blocks: int,
        extras: Sequence[BlockExtras] | None,
        reuse: list[int] | None = None,
    ) -> list[int]:
        """Keys of ``n_blocks`` blocks after ``parent``; without extras, the leading keys equal to
        those of ``reuse`` are its int objects (``native.xxh64_chain``)."""
        ...


def _encode_extras_xxh64(extras: BlockExtras) -> bytes:
    if not extras:
        return b""
    out = bytearray()
    for ident in extras:
        raw = ident.encode()
        out += _LE64(len(raw))
        out += raw
    return bytes(out)


class XXH64Hasher:
    """``hashAlgorithm: xxh64`` (also spelled ``xxhash``)."""

    name = "xxh64"

    def init_hash(self, seed: str) -> int:
        return _xxh64(seed.encode())

    def root(self, init_hash: int, model: str) -> int:
        return _xxh64(_LE64(init_hash) + _encode_extras_xxh64((model,)))

    def chain(
        self,
        parent: int,
        tokens_le32: bytes | memoryview,
        block_size: int,
        n_blocks: int,
        extras: Sequence[BlockExtras] | None,
        reuse: list[int] | None = None,
    ) -> list[int]:
        if extras is None:
            return native.xxh64_chain(parent, tokens_le32, block_size, n_blocks, reuse)
        view = memoryview(tokens_le32)
        step = block_size * 4
        keys: list[int] = []
        append = keys.append
        for i in range(n_blocks):
            start = i * step
            tail = _encode_extras_xxh64(extras[i]) if i < len(extras) else b""
            parent = _xxh64(_LE64(parent) + view[start : start + step] + tail)
            append(parent)
        return keys


# --- cbor-fnv ---------------------------------------------------------------------------------

_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3
_M64 = (1 << 64) - 1


def fnv1a64(data: bytes, h: int = _FNV_OFFSET) -> int:
    """64-bit FNV-1a of ``data``."""
    for byte in data:
        h = ((h ^ byte) * _FNV_PRIME) & _M64
    return h


def _cbor_head(major: int, value: int) -> bytes:
    """Shortest CBOR head (RFC 7049 canonical) for a major type and an argument."""
    mt = major << 5
    if value < 24:
        return bytes((mt | value,))
    if value < 0x100:
        return bytes((mt | 24, value))
    if value < 0x10000:
        return bytes((mt | 25,)) + value.to_bytes(2, "big")
    if value < 0x100000000:
        return bytes((mt | 26,)) + value.to_bytes(4, "big")
    return bytes((mt | 27,)) + value.to_bytes(8, "big")


def _cbor_text(text: str) -> bytes:
    raw = text.encode()
    return _cbor_head(3, len(raw)) + raw


_CBOR_NULL = b"\xf6"
_CBOR_HASH_KEY = _cbor_text("Hash")


def _cbor_extras(extras: BlockExtras) -> bytes:
    if extras is None:
        return _CBOR_NULL
    out = bytearray(_cbor_head(4, len(extras)))
    for ident in extras:
        out += b"\xa1" + _CBOR_HASH_KEY + _cbor_text(ident)  # {"Hash": ident}
    return bytes(out)


class CborFnvHasher:
    """``hashAlgorithm: cbor-fnv`` (llm-d's default): FNV-1a-64 over canonical CBOR."""

    name = "cbor-fnv"

    def init_hash(self, seed: str) -> int:
        return fnv1a64(seed.encode())

    def root(self, init_hash: int, model: str) -> int:
        return fnv1a64(b"\x83" + _cbor_head(0, init_hash) + _CBOR_NULL + _cbor_text(model))

    def chain(
        self,
        parent: int,
        tokens_le32: bytes | memoryview,
        block_size: int,
        n_blocks: int,
        extras: Sequence[BlockExtras] | None,
        reuse: list[int] | None = None,
    ) -> list[int]:
        if extras is None:
            return native.cbor_fnv_chain(parent, tokens_le32, block_size, n_blocks, reuse)
        ids = le32_to_array(memoryview(tokens_le32)[: n_blocks * block_size * 4])
        heads = [_cbor_head(0, t) for t in range(24)]
        block_head = _cbor_head(4, block_size)
        keys: list[int] = []
        for i in range(n_blocks):
            block = ids[i * block_size : (i + 1) * block_size]
            parts = [b"\x83", _cbor_head(0, parent), block_head]
            parts.extend(heads[t] if t < 24 else _cbor_head(0, t) for t in block)
            parts.append(_cbor_extras(extras[i] if extras is not None and i < len(extras) else None))
            parent = fnv1a64(b"".join(parts))
            keys.append(parent)
        return keys


_HASHERS: dict[str, Hasher] = {
    "xxh64": XXH64Hasher(),
    "xxhash": XXH64Hasher(),
    "cbor-fnv": CborFnvHasher(),
    "": CborFnvHasher(),
}


def hasher_for(algorithm: str) -> Hasher:
    """The hasher for an llm-d ``hashAlgorithm`` value; KeyError when unknown."""
    return _HASHERS[algorithm]
