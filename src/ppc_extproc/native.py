"""The request path's per-prompt loops: the C extension ``ppc_extproc._native`` when it was built
(``pip install`` with a C compiler), else the pure-Python equivalents here, which tests hold to
the same results.

* ``json_uint32_array(buf, pos)``: ``(le32 bytes, index of ']')`` of a JSON array of plain
  integers in [0, 2^32) starting at ``buf[pos] == '['``; None for anything else (floats,
  exponents, signs, leading zeros, nesting), which the caller leaves to the reference parser.
* ``msgpack_uint32_array(buf)``: the le32 bytes of ``buf`` when it is exactly one msgpack array
  of unsigned ints in [0, 2^32) in the positive fixint / uint8 / uint16 / uint32 encodings; None
  for anything else (other int encodings, negatives, wider values, non-ints, nesting, truncated or
  trailing bytes), which the caller leaves to msgspec.
* ``dict_prefix(young, old, keys, limit)``: ``(values, done)`` of the leading run of ``keys``
  present in ``young`` or ``old`` (a key found in ``old`` moves to ``young``), stopping at the
  first absent key or the end (``done``) or once a promotion makes ``len(young)`` reach ``limit``
  (not ``done``, even at the last key: the caller rotates its generations and continues after
  the values) — the index's prefix lookup.
* ``remap(target, keys, values, mapping)``: ``target[key] = mapping[value]`` (``del`` when that
  is None) for each key whose value ``mapping`` holds; how many keys were touched. A prompt's
  keys hold few distinct index masks: the caller computes each new mask once.
* ``runs(values)``: ``[(value, count), ...]`` of consecutive equal values.
* ``prefix_runs(young, old, keys, start, limit)``: ``(runs, end, done)``: ``dict_prefix``'s walk
  from ``keys[start]`` as ``runs`` of its values, and the index after the last key walked, in one
  pass that builds no list of a value per key (U64Maps only; ``py_prefix_runs`` takes dicts too).
* ``common_prefix(a, a_start, b, b_start)``: how many bytes ``a[a_start:]`` and ``b[b_start:]``
  have in common from their start (0 for a start outside its buffer).
* ``U64Map``: a hash table from ints in [0, 2^64) stored inline to objects, the subset of a
  dict the index's LRU uses (``_u64map.c``); ``dict_prefix`` and ``remap`` take it in place of
  dicts. None without the extension (the LRU then uses dicts).
* ``xxh64_chain`` / ``cbor_fnv_chain(parent, tokens_le32, block_size, n_blocks, reuse=None)``:
  llm-d's request key chains without extras, one call per prompt; the leading keys equal to those
  of the list ``reuse`` are its very int objects (a dict probe with the object the dict stores
  matches by identity, without reading the stored key).
"""

from __future__ import annotations

import os
import re
import sys
from array import array
from collections.abc import Callable
from typing import Any

import xxhash

__all__ = [
    "NATIVE",
    "U64Map",
    "cbor_fnv_chain",
    "common_prefix",
    "dict_prefix",
    "json_uint32_array",
    "msgpack_uint32_array",
    "prefix_runs",
    "py_cbor_fnv_chain",
    "py_common_prefix",
    "py_dict_prefix",
    "py_json_uint32_array",
    "py_msgpack_uint32_array",
    "py_prefix_runs",
    "py_remap",
    "py_runs",
    "py_xxh64_chain",
    "remap",
    "runs",
    "xxh64_chain",
]

_UINT32_MAX = 0xFFFFFFFF
_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3
_M64 = (1 << 64) - 1
_WS = b" \t\n\r"
# One JSON value of the array: a plain non-negative integer without leading zeros.
_ARRAY = re.compile(rb"\[[ \t\n\r]*(?:(?:0|[1-9][0-9]*)(?:[ \t\n\r]*,[ \t\n\r]*(?:0|[1-9][0-9]*))*)?[ \t\n\r]*\]")


def py_json_uint32_array(buf: bytes | bytearray | memoryview, pos: int) -> tuple[bytes, int] | None:
    """Pure-Python ``json_uint32_array``."""
    data = bytes(buf)
    match = _ARRAY.match(data, pos)
    if match is None:
        return None
    inner = data[pos + 1 : match.end() - 1].strip(_WS)
    values = [int(v) for v in inner.split(b",")] if inner else []
    if any(v > _UINT32_MAX for v in values):
        return None
    return _le32(array("I", values)).tobytes(), match.end() - 1


# Array heads: (first byte, header length, count bytes); fixarray 0x90-0x9f carries its count.
_MSGPACK_ARRAY = {0xDC: 2, 0xDD: 4}
# Int heads: first byte → bytes of the big-endian value after it.
_MSGPACK_UINT = {0xCC: 1, 0xCD: 2, 0xCE: 4}


def py_msgpack_uint32_array(buf: bytes | bytearray | memoryview) -> bytes | None:
    """Pure-Python ``msgpack_uint32_array``."""
    data = bytes(buf)
    if not data:
        return None
    head = data[0]
    if 0x90 <= head <= 0x9F:
        count, pos = head & 0x0F, 1
    elif head in _MSGPACK_ARRAY and len(data) > _MSGPACK_ARRAY[head]:
        width = _MSGPACK_ARRAY[head]
        count, pos = int.from_bytes(data[1 : 1 + width], "big"), 1 + width
    else:
        return None
    values = array("I")
    for _ in range(count):
        if pos >= len(data):
            return None
        b = data[pos]
        if b <= 0x7F:
            values.append(b)
            pos += 1
            continue
        width = _MSGPACK_UINT.get(b, 0)
        if not width or pos + 1 + width > len(data):
            return None
        values.append(int.from_bytes(data[pos + 1 : pos + 1 + width], "big"))
        pos += 1 + width
    if pos != len(data):
        return None
    return _le32(values).tobytes()


def _le32(ids: array[int]) -> array[int]:
    if sys.byteorder == "big":  # pragma: no cover - no big-endian CI machine
        ids.byteswap()
    return ids


def py_xxh64_chain(
    parent: int, tokens_le32: bytes | bytearray | memoryview, block_size: int, n_blocks: int,
    reuse: list[int] | None = None,
) -> list[int]:
    """Pure-Python ``xxh64_chain``."""
    _check(tokens_le32, block_size, n_blocks)
    view = memoryview(tokens_le32).cast("B")
    step = block_size * 4
    digest = xxhash.xxh64_intdigest
    keys: list[int] = []
    for start in range(0, n_blocks * step, step):
        parent = digest(parent.to_bytes(8, "little") + view[start : start + step])
        keys.append(parent)
    return _reuse(keys, reuse)


def _reuse(keys: list[int], reuse: list[int] | None) -> list[int]:
    if reuse is not None:
        for i, (key, old) in enumerate(zip(keys, reuse)):
            if type(old) is not int or old != key:
                break
            keys[i] = old
    return keys


def _fnv_head(h: int, major: int, value: int) -> int:
    mt = major << 5
    if value < 24:
        head = bytes((mt | value,))
    elif value < 0x100:
        head = bytes((mt | 24, value))
    elif value < 0x10000:
        head = bytes((mt | 25,)) + value.to_bytes(2, "big")
    elif value < 0x100000000:
        head = bytes((mt | 26,)) + value.to_bytes(4, "big")
    else:
        head = bytes((mt | 27,)) + value.to_bytes(8, "big")
    for byte in head:
        h = ((h ^ byte) * _FNV_PRIME) & _M64
    return h


def py_cbor_fnv_chain(
    parent: int, tokens_le32: bytes | bytearray | memoryview, block_size: int, n_blocks: int,
    reuse: list[int] | None = None,
) -> list[int]:
    """Pure-Python ``cbor_fnv_chain``."""
    _check(tokens_le32, block_size, n_blocks)
    ids = array("I")
    ids.frombytes(memoryview(tokens_le32).cast("B")[: n_blocks * block_size * 4])
    _le32(ids)
    keys: list[int] = []
    for i in range(n_blocks):
        h = ((_FNV_OFFSET ^ 0x83) * _FNV_PRIME) & _M64
        h = _fnv_head(h, 0, parent)
        h = _fnv_head(h, 4, block_size)
        for token in ids[i * block_size : (i + 1) * block_size]:
            h = _fnv_head(h, 0, token)
        parent = ((h ^ 0xF6) * _FNV_PRIME) & _M64
        keys.append(parent)
    return _reuse(keys, reuse)


def py_dict_prefix(young: dict[Any, Any], old: dict[Any, Any], keys: list[Any], limit: int) -> tuple[list[Any], bool]:
    """Pure-Python ``dict_prefix``."""
    values: list[Any] = []
    for key in keys:
        value = young.get(key)
        if value is None:
            value = old.pop(key, None)
            if value is None:
                return values, True
            young[key] = value
            values.append(value)
            if len(young) >= limit:
                return values, False  # even at the last key: the caller rotates
            continue
        values.append(value)
    return values, True


def py_remap(target: dict[Any, Any], keys: list[Any], values: list[Any], mapping: dict[Any, Any]) -> int:
    """Pure-Python ``remap``."""
    if len(keys) != len(values):
        raise ValueError("keys and values differ in length")
    touched = 0
    for key, value in zip(keys, values):
        if value in mapping:
            new = mapping[value]
            if new is None:
                target.pop(key, None)
            else:
                target[key] = new
            touched += 1
    return touched


def py_prefix_runs(young: Any, old: Any, keys: list[Any], start: int, limit: int) -> tuple[list[tuple[Any, int]], int, bool]:
    """``prefix_runs`` as ``dict_prefix`` then ``runs`` (dicts or U64Maps)."""
    values, done = dict_prefix(young, old, keys[start:], limit)
    return runs(values), start + len(values), done


def py_runs(values: list[Any]) -> list[tuple[Any, int]]:
    """Pure-Python ``runs``."""
    out: list[tuple[Any, int]] = []
    for value in values:
        if out and out[-1][0] == value:
            out[-1] = (value, out[-1][1] + 1)
        else:
            out.append((value, 1))
    return out


def py_common_prefix(a: bytes | bytearray | memoryview, a_start: int, b: bytes | bytearray | memoryview, b_start: int) -> int:
    """Pure-Python ``common_prefix``: equal 4 KiB pages compared as slices, then bytes."""
    x, y = memoryview(a).cast("B"), memoryview(b).cast("B")
    if not (0 <= a_start <= len(x) and 0 <= b_start <= len(y)):
        return 0
    x, y = x[a_start:], y[b_start:]
    limit, n = min(len(x), len(y)), 0
    while n + 4096 <= limit and x[n : n + 4096] == y[n : n + 4096]:
        n += 4096
    while n < limit and x[n] == y[n]:
        n += 1
    return n


def _check(tokens_le32: bytes | bytearray | memoryview, block_size: int, n_blocks: int) -> None:
    if block_size <= 0 or n_blocks < 0 or n_blocks > memoryview(tokens_le32).nbytes // (4 * block_size):
        raise ValueError("n_blocks full blocks of block_size tokens exceed the buffer")


Chain = Callable[[int, bytes | bytearray | memoryview, int, int, list[int] | None], list[int]]
json_uint32_array: Callable[[bytes | bytearray | memoryview, int], tuple[bytes, int] | None]
msgpack_uint32_array: Callable[[bytes | bytearray | memoryview], bytes | None]
xxh64_chain: Chain
cbor_fnv_chain: Chain
remap: Callable[[Any, list[Any], list[Any], dict[Any, Any]], int]
common_prefix: Callable[[bytes | bytearray | memoryview, int, bytes | bytearray | memoryview, int], int]
runs: Callable[[list[Any]], list[tuple[Any, int]]]
dict_prefix: Callable[[Any, Any, list[Any], int], tuple[list[Any], bool]]
prefix_runs: Callable[[Any, Any, list[Any], int, int], tuple[list[tuple[Any, int]], int, bool]]
#: ``_native.U64Map`` (a dict-like table over uint64 keys), or None without the extension.
U64Map: Callable[[], Any] | None

try:  # PPC_EXTPROC_PURE_PYTHON=1 forces the fallbacks (tests, comparisons)
    if os.environ.get("PPC_EXTPROC_PURE_PYTHON"):
        raise ImportError
    from ppc_extproc import _native  # type: ignore[attr-defined]
except ImportError:
    NATIVE = False
    json_uint32_array, xxh64_chain, cbor_fnv_chain = py_json_uint32_array, py_xxh64_chain, py_cbor_fnv_chain
    msgpack_uint32_array = py_msgpack_uint32_array
    dict_prefix, runs, remap = py_dict_prefix, py_runs, py_remap
    prefix_runs = py_prefix_runs
    common_prefix = py_common_prefix
    U64Map = None
else:
    NATIVE = True
    json_uint32_array = _native.json_uint32_array
    msgpack_uint32_array = _native.msgpack_uint32_array
    xxh64_chain = _native.xxh64_chain
    cbor_fnv_chain = _native.cbor_fnv_chain
    dict_prefix, runs, remap = _native.dict_prefix, _native.runs, _native.remap
    prefix_runs = _native.prefix_runs
    common_prefix = _native.common_prefix
    U64Map = _native.U64Map
