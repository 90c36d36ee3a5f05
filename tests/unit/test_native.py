"""The C extension and its pure-Python fallbacks give the same keys and the same token arrays:
llm-d's hash vectors, independent encodings (cbor2, xxhash), and hypothesis."""

from __future__ import annotations

import json
import os
import struct

import cbor2
import msgspec
import pytest
import xxhash
from hypothesis import example, given, settings
from hypothesis import strategies as st
from vectors import load_vectors, token_range

from ppc_extproc import native
from ppc_extproc.blockkeys import TokenProcessor, TokenProcessorConfig
from ppc_extproc.blockkeys.hashing import fnv1a64
from ppc_extproc.tokens.le32 import tokens_to_le32

VECTORS = [v for v in load_vectors("llmd_hash_vectors.json")["hash_vectors"] if not v.get("extraPerBlock")]
CHAINS = {"xxh64": (native.xxh64_chain, native.py_xxh64_chain), "cbor-fnv": (native.cbor_fnv_chain, native.py_cbor_fnv_chain)}
ARRAYS = [native.json_uint32_array, native.py_json_uint32_array]
ARRAY_IDS = ["native", "python"]



@pytest.mark.skipif(bool(os.environ.get("PPC_EXTPROC_PURE_PYTHON")), reason="fallbacks forced")
def test_extension_is_built_here() -> None:
    # `pip install -e .` on this machine builds it; a missing build would silently test Python twice.
    assert native.NATIVE


@pytest.mark.parametrize("vector", VECTORS, ids=[v["name"] for v in VECTORS])
@pytest.mark.parametrize("which", [0, 1], ids=["native", "python"])
def test_chains_reproduce_llmd_vectors(vector: dict, which: int) -> None:
    processor = TokenProcessor(TokenProcessorConfig(vector["blockSize"], vector["hashSeed"], vector["algorithm"]))
    tokens = tokens_to_le32(token_range(vector["tokens"]))
    parent = int(vector["parent"]) or processor.root(vector["model"])
    n_blocks = len(tokens) // (4 * vector["blockSize"])
    chain = CHAINS["xxh64" if vector["algorithm"] in ("xxh64", "xxhash") else "cbor-fnv"][which]
    assert [str(k) for k in chain(parent, tokens, vector["blockSize"], n_blocks)] == vector["keys"]


def _reference_xxh64(parent: int, tokens: list[int], block_size: int) -> list[int]:
    keys = []
    for i in range(len(tokens) // block_size):
        block = tokens[i * block_size : (i + 1) * block_size]
        parent = xxhash.xxh64_intdigest(struct.pack(f"<Q{len(block)}I", parent, *block))
        keys.append(parent)
    return keys


def _reference_cbor_fnv(parent: int, tokens: list[int], block_size: int) -> list[int]:
    keys = []
    for i in range(len(tokens) // block_size):
        block = tokens[i * block_size : (i + 1) * block_size]
        parent = fnv1a64(cbor2.dumps([parent, block, None], canonical=True))
        keys.append(parent)
    return keys


@settings(max_examples=150, deadline=None)
@given(
    parent=st.integers(0, 2**64 - 1),
    tokens=st.lists(st.integers(0, 2**32 - 1), max_size=200),
    block_size=st.integers(1, 40),
)
def test_chains_match_independent_encodings(parent: int, tokens: list[int], block_size: int) -> None:
    data = tokens_to_le32(tokens)
    n_blocks = len(tokens) // block_size
    expected = {"xxh64": _reference_xxh64(parent, tokens, block_size),
                "cbor-fnv": _reference_cbor_fnv(parent, tokens, block_size)}
    for name, chains in CHAINS.items():
        for chain in chains:
            assert chain(parent, data, block_size, n_blocks) == expected[name]
            assert chain(parent, memoryview(data), block_size, n_blocks) == expected[name]


@settings(max_examples=150, deadline=None)
@given(
    tokens=st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=120),
    tail=st.lists(st.integers(0, 2**32 - 1), max_size=60),
    cut=st.integers(0, 120),
    block_size=st.integers(1, 16),
)
def test_chains_reuse_the_int_objects_of_the_shared_leading_keys(
    tokens: list[int], tail: list[int], cut: int, block_size: int
) -> None:
    first = tokens_to_le32(tokens)
    second = tokens_to_le32(tokens[:cut] + tail)
    for chains in CHAINS.values():
        for chain in chains:
            previous = chain(7, first, block_size, len(tokens) // block_size)
            n = len(second) // (4 * block_size)
            keys = chain(7, second, block_size, n, previous)
            assert keys == chain(7, second, block_size, n)  # the same values with or without reuse
            shared = 0
            while shared < min(n, len(previous)) and keys[shared] == previous[shared]:
                shared += 1
            assert all(keys[i] is previous[i] for i in range(shared))
            assert all(keys[i] is not previous[j] for i in range(shared, n) for j in range(len(previous)))


@pytest.mark.parametrize("chain", [c for pair in CHAINS.values() for c in pair])
def test_reuse_ignores_what_is_not_an_equal_int(chain) -> None:  # type: ignore[no-untyped-def]
    data = tokens_to_le32(list(range(64)))
    keys = chain(3, data, 16, 4)
    assert chain(3, data, 16, 4, [True, *keys[1:]]) == keys
    assert chain(3, data, 16, 4, ["x"]) == keys
    assert chain(3, data, 16, 4, [-1, 2**70]) == keys
    assert chain(3, data, 16, 4, []) == keys
    assert chain(3, data, 16, 4, keys + [5])[3] is keys[3]


@pytest.mark.parametrize("chain", [c for pair in CHAINS.values() for c in pair])
def test_chain_refuses_more_blocks_than_the_buffer_holds(chain) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="exceed"):
        chain(0, b"\x00" * 60, 16, 1)
    assert chain(0, b"", 16, 0) == []


@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.integers(0, 2**32 - 1), max_size=300), spaces=st.sampled_from(["", " ", "\n\t ", "\r\n"]))
def test_uint32_arrays_parse_to_le32(values: list[int], spaces: str) -> None:
    text = b'{"prompt": [' + (spaces + "," + spaces).join(map(str, values)).encode() + spaces.encode() + b'], "x": 1}'
    pos = text.index(b"[")
    for parse in ARRAYS:
        assert parse(text, pos) == (tokens_to_le32(values), text.index(b"]"))
        assert parse(bytearray(text), pos) == (tokens_to_le32(values), text.index(b"]"))


@pytest.mark.parametrize("text", [
    b"[1.0]", b"[1e3]", b"[-1]", b"[01]", b"[4294967296]", b"[99999999999999999999]", b"[1,]", b"[,1]",
    b"[1 2]", b"[[1]]", b'["1"]', b"[true]", b"[1", b"[", b"x[1]", b"[1,,2]", b"[null]", b"[1\x0b]",
])  # fmt: skip
@pytest.mark.parametrize("parse", ARRAYS, ids=ARRAY_IDS)
def test_anything_but_plain_uint32_arrays_is_refused(text: bytes, parse) -> None:  # type: ignore[no-untyped-def]
    assert parse(text, 0) is None


@pytest.mark.parametrize("text", [
    b"[1.0]", b"[1e3]", b"[-1]", b"[01]", b"[4294967296]", b"[1,]", b"[,1]", b"[1 2]", b"[[1]]", b'["1"]',
    b"[1,,2]", b"[1\x0b]", b"[12,007,3]", b"[1234567,12345678.5]", b"[123456789012]", b"[5,1/2]", b"[5,1:2]",
    b"[5,\xfa1]", b"[5\xff,1]", b"[99,0000000001]", b"[4294967295,4294967296]",
])  # fmt: skip
@pytest.mark.parametrize("parse", ARRAYS, ids=ARRAY_IDS)
def test_refusals_hold_where_eight_bytes_are_read_at_once(text: bytes, parse) -> None:  # type: ignore[no-untyped-def]
    # Padding after the array: the extension reads digits 8 bytes at a time when 8 bytes remain.
    assert parse(text + b' , "pad": "                "}', 0) is None


@settings(max_examples=400, deadline=None)
@given(inner=st.lists(st.sampled_from([b"0", b"1", b"7", b"9", b"12345", b"9876543", b"12345678", b"4294967295",
                                       b"4294967296", b",", b" ", b"\n", b".", b"e", b"-", b"/", b":", b"\xfa", b"a"]),
                      max_size=40),
       pad=st.sampled_from([b"", b"}", b' , "x": "0123456789abcdef"}']))
def test_the_extension_refuses_and_accepts_exactly_what_the_fallback_does(inner: list[bytes], pad: bytes) -> None:
    text = b"[" + b"".join(inner) + b"]" + pad
    expected = native.py_json_uint32_array(text, 0)
    assert native.json_uint32_array(text, 0) == expected


# Pieces that put numbers, separators and refusals at every offset of the 8-byte reads.
_PIECES = [b"0", b"3", b"12", b"999999", b"12345678", b"123456789", b"4294967295", b"4294967296",
           b"99999999999", b"00", b"01", b",", b", ", b" ,", b"\n", b"\t", b"\r", b"   ", b" " * 17, b" " * 64,
           b".", b"e", b"-", b"a", b"[", b"\x00", b"\xb0"]


@settings(max_examples=600, deadline=None)
@given(lead=st.integers(0, 70), inner=st.lists(st.sampled_from(_PIECES), max_size=60),
       offset=st.integers(0, 3), pad=st.sampled_from([b"", b"}", b' , "x": "0123456789abcdef"}']))
def test_both_scans_agree_at_every_offset(lead: int, inner: list[bytes], offset: int, pad: bytes) -> None:
    # A valid run of `lead` numbers first pushes what follows to every offset of the buffer.
    text = b"x" * offset + b"[" + b",".join([b"7"] * lead) + (b"," if lead and inner else b"") + b"".join(inner) + b"]" + pad
    expected = native.py_json_uint32_array(text, offset)
    assert native.json_uint32_array(text, offset) == expected


@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=400),
       seps=st.lists(st.sampled_from([",", ", ", " ,", ",\n", " , ", ",  \t", "\r\n,"]), min_size=1, max_size=8),
       cut=st.integers(0, 64))
def test_valid_arrays_with_mixed_separators_parse_everywhere(values: list[int], seps: list[str], cut: int) -> None:
    body = "[" + "".join(str(v) + (seps[i % len(seps)] if i + 1 < len(values) else "") for i, v in enumerate(values)) + "]"
    text = (" " * cut + body).encode()
    for parse in ARRAYS:  # the array ends at the buffer's last byte: no readable bytes after ']'
        assert parse(text, cut) == (tokens_to_le32(values), len(text) - 1)


@pytest.mark.parametrize("parse", ARRAYS, ids=ARRAY_IDS)
@pytest.mark.parametrize("at", [0, 1, 15, 16, 31, 32, 62, 63, 64, 65, 127, 128])
def test_a_refusal_at_every_offset(parse, at: int) -> None:  # type: ignore[no-untyped-def]
    for bad in (b"1.5", b"01", b"1 2", b",,", b"4294967296", b"-1", b"1e2", b"x"):
        filler = b"1," * (at // 2) + (b" " if at % 2 else b"")
        assert parse(b"[" + filler + bad + b"]", 0) is None, (at, bad)
        assert parse(b"[" + filler + b"5]", 0) == (tokens_to_le32([1] * (at // 2) + [5]), len(filler) + 2)


@pytest.mark.parametrize("digits", range(1, 11))
@pytest.mark.parametrize("parse", ARRAYS, ids=ARRAY_IDS)
def test_every_digit_count_parses(digits: int, parse) -> None:  # type: ignore[no-untyped-def]
    values = [int("9" * digits) if digits < 10 else 2**32 - 1, int("1" + "0" * (digits - 1)), 5]
    text = b"[" + b",".join(str(v).encode() for v in values) + b'], "model": "m"}'
    assert parse(text, 0) == (tokens_to_le32(values), text.index(b"]"))


@pytest.mark.parametrize("parse", ARRAYS, ids=ARRAY_IDS)
def test_edges_of_the_uint32_range_and_empty_arrays(parse) -> None:  # type: ignore[no-untyped-def]
    assert parse(b"[ ]", 0) == (b"", 2)
    assert parse(b"[0, 4294967295]", 0) == (tokens_to_le32([0, 2**32 - 1]), 14)
    assert parse(b"ab[7]", 2) == (tokens_to_le32([7]), 4)
    assert parse(b"[7]", 5) is None
    assert json.loads(b"[0, 4294967295]") == [0, 2**32 - 1]


@settings(max_examples=200, deadline=None)
@given(
    young=st.dictionaries(st.integers(0, 30), st.integers(1, 5), max_size=15),
    old=st.dictionaries(st.integers(0, 30), st.integers(1, 5), max_size=15),
    keys=st.lists(st.integers(0, 30), max_size=20, unique=True),
    limit=st.integers(1, 40),
)
def test_dict_prefix_versions_agree(young: dict, old: dict, keys: list, limit: int) -> None:
    old = {k: v for k, v in old.items() if k not in young}
    results = []
    for prefix in (native.dict_prefix, native.py_dict_prefix):
        y, o = dict(young), dict(old)
        results.append((prefix(y, o, list(keys), limit), y, o))
    assert results[0] == results[1]
    (values, done), y, o = results[1]
    assert values == [young.get(k, old.get(k)) for k in keys[: len(values)]]
    assert done == (len(y) < limit or len(y) == len(young))  # not done: a promotion reached the limit


#: Mask values; a 2**70 drawn may be a distinct int object (equal masks need not be identical).
_MASKS = st.sampled_from([1, 2, 2**70]).map(lambda v: int(str(v)))


def _u64map(items: dict) -> object:
    table = native.U64Map()
    for k, v in items.items():
        table[k] = v
    return table


@pytest.mark.skipif(native.U64Map is None, reason="no extension")
@settings(max_examples=300, deadline=None)
@given(
    young=st.dictionaries(st.integers(0, 30), _MASKS, max_size=15),
    old=st.dictionaries(st.integers(0, 30), _MASKS, max_size=15),
    keys=st.lists(st.integers(0, 30), max_size=20, unique=True),
    start=st.integers(0, 22),
    limit=st.integers(1, 40),
)
@example(young={1: int(str(2**70)), 2: int(str(2**70))}, old={}, keys=[1, 2], start=0, limit=10)
def test_prefix_runs_versions_agree(young: dict, old: dict, keys: list, start: int, limit: int) -> None:
    # The C walk on U64Maps against dict_prefix + runs on dicts: the same runs, end and promotions.
    old = {k: v for k, v in old.items() if k not in young}
    y, o = dict(young), dict(old)
    expected = native.py_prefix_runs(y, o, list(keys), start, limit)
    ny, no = _u64map(young), _u64map(old)
    assert native.prefix_runs(ny, no, [*keys], start, limit) == expected
    assert (dict(ny.items()), dict(no.items())) == (y, o)
    runs, end, _ = expected
    assert sum(n for _, n in runs) == max(0, end - start)


@given(values=st.lists(st.sampled_from([1, 2, 3, 2**70]), max_size=40))
def test_runs_versions_agree(values: list) -> None:
    encoded = native.runs(values)
    assert encoded == native.py_runs(values)
    assert [v for v, n in encoded for _ in range(n)] == values


@given(
    target=st.dictionaries(st.integers(0, 20), st.integers(0, 4), max_size=15),
    keys=st.lists(st.integers(0, 20), max_size=20),
    mapping=st.dictionaries(st.one_of(st.none(), st.integers(0, 4)), st.one_of(st.none(), st.integers(5, 9)), max_size=4),
)
def test_remap_versions_agree(target: dict, keys: list, mapping: dict) -> None:
    values = [target.get(k) for k in keys]
    results = []
    for remap in (native.remap, native.py_remap):
        t = dict(target)
        results.append((remap(t, list(keys), list(values), mapping), t))
    assert results[0] == results[1]


MSGPACK_ARRAYS = [native.msgpack_uint32_array, native.py_msgpack_uint32_array]


@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.integers(0, 2**32 - 1), max_size=300), array32=st.booleans())
def test_msgpack_uint32_arrays_convert_to_le32(values: list[int], array32: bool) -> None:
    packed = msgspec.msgpack.encode(values)  # shortest forms, as vLLM's msgspec encoder writes them
    if array32:  # the same values under a 32-bit array head
        head = 1 if packed[0] & 0xF0 == 0x90 else 3
        packed = b"\xdd" + struct.pack(">I", len(values)) + packed[head:]
    for convert in MSGPACK_ARRAYS:
        assert convert(packed) == tokens_to_le32(values)
        assert convert(bytearray(packed)) == tokens_to_le32(values)
        assert convert(memoryview(packed)) == tokens_to_le32(values)


@pytest.mark.parametrize("packed", [
    b"", b"\x91", b"\x92\x01", b"\x91\xcc", b"\x91\xcd\x01", b"\x91\xce\x01\x02\x03", b"\xdc\x00", b"\xdd\x00\x00",
    b"\x91\xff", b"\x91\xd0\x05", b"\x91\xcf" + bytes(8), b"\x91\xd3" + bytes(8), b"\x91\xc0", b"\x91\xc3",
    b"\x91\xca" + bytes(4), b"\x91\x91\x01", b"\x91\xa1a", b"\x90\x00", b"\x91\x01\x02", b"\x01", b"\x80",
    b"\xdd\xff\xff\xff\xff\x01", b"\xdc\x00\x03\x01\x02",
])  # fmt: skip
@pytest.mark.parametrize("convert", MSGPACK_ARRAYS, ids=["native", "python"])
def test_anything_but_one_msgpack_uint32_array_is_refused(packed: bytes, convert) -> None:  # type: ignore[no-untyped-def]
    # Truncated, trailing bytes, negative / signed / uint64 / float encodings, nil, bool, str, nesting.
    assert convert(packed) is None


@pytest.mark.parametrize("convert", MSGPACK_ARRAYS, ids=["native", "python"])
def test_msgpack_edges_of_the_uint32_range(convert) -> None:  # type: ignore[no-untyped-def]
    assert convert(b"\x90") == b""
    assert convert(b"\xdc\x00\x00") == b""
    assert convert(msgspec.msgpack.encode([0, 127, 128, 255, 256, 65535, 65536, 2**32 - 1])) == tokens_to_le32(
        [0, 127, 128, 255, 256, 65535, 65536, 2**32 - 1]
    )
    assert convert(msgspec.msgpack.encode([2**32])) is None


_MSGPACK_PIECES = [b"\x00", b"\x7f", b"\x80", b"\x90", b"\x9f", b"\xcc", b"\xcd", b"\xce", b"\xcf", b"\xd0", b"\xdc",
                   b"\xdd", b"\xff", b"\x01\x02", b"\x00\x00\x00"]


@settings(max_examples=500, deadline=None)
@given(pieces=st.lists(st.sampled_from(_MSGPACK_PIECES), max_size=30))
def test_the_msgpack_extension_refuses_and_accepts_exactly_what_the_fallback_does(pieces: list[bytes]) -> None:
    packed = b"".join(pieces)
    got = native.msgpack_uint32_array(packed)
    assert got == native.py_msgpack_uint32_array(packed)
    if got is not None:  # an accepted buffer is msgpack holding those very ids
        assert msgspec.msgpack.decode(packed, type=list[int]) == list(struct.unpack(f"<{len(got) // 4}I", got))


@settings(max_examples=300, deadline=None)
@given(
    shared=st.binary(max_size=9000),
    a_tail=st.binary(max_size=20),
    b_tail=st.binary(max_size=20),
    a_lead=st.binary(max_size=5),
    b_lead=st.binary(max_size=5),
    shift=st.integers(-2, 2),
)
def test_common_prefix_versions_agree(
    shared: bytes, a_tail: bytes, b_tail: bytes, a_lead: bytes, b_lead: bytes, shift: int
) -> None:
    a, b = a_lead + shared + a_tail, b_lead + shared + b_tail
    a_start, b_start = len(a_lead) + shift, len(b_lead)
    expected = native.py_common_prefix(a, a_start, b, b_start)
    assert native.common_prefix(a, a_start, b, b_start) == expected
    if shift == 0:
        assert expected >= len(shared)
    assert native.common_prefix(a, a_start, a, a_start) == native.py_common_prefix(a, a_start, a, a_start)
    if 0 <= a_start <= len(a):  # the definition, byte by byte
        x, y = a[a_start:], b[b_start:]
        n = 0
        while n < min(len(x), len(y)) and x[n] == y[n]:
            n += 1
        assert expected == n
    else:
        assert expected == 0
