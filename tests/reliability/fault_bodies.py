"""Request bodies for the fault suite: mostly malformed, in every size class, as raw bytes.

A body is built as a tree (``Obj`` keeps duplicate keys, ``Raw`` is literal JSON text such as
``NaN`` or a 25-digit integer), encoded by hand, then optionally damaged at the byte level
(truncated, a byte replaced, invalid UTF-8, a BOM, trailing garbage). ``sized`` pads a body with
trailing whitespace — insignificant in JSON, so the document means the same in every size class:
under 4 KiB (orjson), 4–64 KiB (simdjson at end of stream) and ≥ 64 KiB sent in chunks (the
streaming extractor).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from ppc_extproc.errors import BadRequestError
from ppc_extproc.tokens import ParsedBody, parse_body
from ppc_extproc.tokens.body import parse_body_reference, token_field_for_path
from ppc_extproc.tokens.streaming import StreamingPrompt

COMPLETIONS = "/v1/completions"
GENERATE = "/inference/v1/generate"
EMBEDDINGS = "/v1/embeddings"
CHAT = "/v1/chat/completions"  # no token field: only model, stream and cache_salt are read
PATHS = (COMPLETIONS, GENERATE, EMBEDDINGS, CHAT)
_FIELDS = {COMPLETIONS: "prompt", GENERATE: "token_ids", EMBEDDINGS: "input", CHAT: "messages"}
#: Size classes: what each path of the parser sees (see the module docstring).
SMALL, FAST, STREAMED = 0, 4096, 70_000
#: Envoy's chunking of a streamed body (what bench_decision and the conformance tests use).
CHUNK_BYTES = 16 * 1024


@dataclass(frozen=True)
class Raw:
    """Literal JSON text, inserted as is."""

    text: str


@dataclass(frozen=True)
class Obj:
    """A JSON object as ordered pairs (so keys can repeat)."""

    pairs: tuple[tuple[str, Any], ...]


def encode(value: Any) -> str:
    if isinstance(value, Raw):
        return value.text
    if isinstance(value, Obj):
        return "{" + ",".join(f"{json.dumps(k)}:{encode(v)}" for k, v in value.pairs) + "}"
    if isinstance(value, dict):
        return encode(Obj(tuple(value.items())))
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(encode(v) for v in value) + "]"
    return json.dumps(value)


# --- the tree ------------------------------------------------------------------------------------

token = st.integers(0, 2**32 - 1)
tokens = st.lists(token, max_size=40)
bad_token = st.one_of(
    st.integers(max_value=-1),
    st.integers(min_value=2**32),
    st.integers(min_value=10**20, max_value=10**30),  # beyond 64 bits: simdjson refuses, orjson reads a float
    st.floats(allow_nan=False, allow_infinity=False).filter(lambda f: not f.is_integer()),
    st.just(3.0),  # integral float: accepted as 3
    st.booleans(),
    st.none(),
    st.text(max_size=3),
    st.just({"id": 1}),
    st.just([[1]]),
)
special = st.sampled_from(
    [
        Raw("NaN"),
        Raw("Infinity"),
        Raw("-Infinity"),
        Raw("1e999"),
        Raw("-0"),
        Raw("1" * 25),
        Raw("-" + "9" * 21),
        Raw("18446744073709551616"),
        Raw('"\\ud800"'),
        Raw('"\\udc00x"'),
        Raw('"\\u0000"'),
        Raw("1E2"),
        Raw("[]"),
        Raw("{}"),
    ]
)


def deep(depth: int, kind: str) -> Raw:
    if kind == "array":
        return Raw("[" * depth + "]" * depth)
    return Raw('{"a":' * depth + "1" + "}" * depth)


nesting = st.builds(deep, st.integers(1000, 1100), st.sampled_from(["array", "object"]))


def with_bad(values: list[Any], bad: Any, where: int) -> list[Any]:
    out = list(values)
    out.insert(where % (len(out) + 1), bad)
    return out


def long_prompt(n: int, bad: Any, where: int | None) -> list[Any]:
    """``n`` tokens (a body that spans several chunks), maybe with one bad element at ``where``."""
    values: list[Any] = [(i * 7919) % 50_000 for i in range(n)]
    return values if where is None else with_bad(values, bad, where)


def mostly(good: st.SearchStrategy[Any], bad: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """``good`` two times in three, else ``bad``."""
    return st.integers(0, 2).flatmap(lambda i: bad if i == 0 else good)


prompt_value = mostly(
    st.one_of(
        tokens,
        st.lists(tokens, min_size=1, max_size=4),  # a batch of prompts
        st.builds(long_prompt, st.integers(1_000, 20_000), bad_token, st.none()),
        st.text(max_size=20),
    ),
    st.one_of(
        st.builds(long_prompt, st.integers(1_000, 20_000), bad_token, st.integers(0, 20_000)),
        st.builds(with_bad, tokens, bad_token, st.integers(0, 40)),
        st.builds(with_bad, st.lists(tokens, min_size=1, max_size=3), st.one_of(bad_token, tokens), st.integers(0, 4)),
        st.text(max_size=20),
        st.lists(st.text(max_size=5), max_size=3),
        st.just({"tokens": [1, 2]}),
        st.integers(),
        st.booleans(),
        st.none(),
        nesting,
        special,
    ),
)
messages_value = mostly(
    st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system"]), "content": st.text(max_size=20)}),
             min_size=1, max_size=3),
    st.one_of(st.just([{"role": "user", "content": [{"type": "text", "text": 5}]}]), st.text(max_size=5), st.integers(),
              nesting, special),
)
model_value = mostly(
    st.sampled_from(["m", "my-model", "Qwen/Qwen2.5-1.5B-Instruct"]),
    st.one_of(st.text(max_size=10), st.integers(), st.booleans(), st.none(), st.just(["m"]), special),
)
stream_value = mostly(st.booleans(), st.one_of(st.none(), st.sampled_from(["yes", 1, 0, [True]]), special))
salt_value = mostly(st.text(min_size=1, max_size=8), st.one_of(st.none(), st.integers(), st.just(["s"])))
other_value = st.one_of(
    st.integers(),
    st.integers(min_value=10**20, max_value=10**40),
    st.floats(allow_nan=False),
    st.text(max_size=10),
    st.lists(st.integers(), max_size=5),
    special,
    nesting,
)
features_value = st.one_of(
    st.none(),
    st.just({"mm_hashes": {"image": ["a"]}, "mm_placeholders": {"image": [{"offset": 0, "length": 16}]}}),
    st.just({"mm_hashes": {"image": "a"}}),
    st.just({"mm_hashes": {"image": [1]}, "mm_placeholders": {"image": [{"offset": 0, "length": 4}]}}),
    st.just({"mm_hashes": {"image": ["a"]}, "mm_placeholders": {"image": [{"offset": -1, "length": 4}]}}),
    st.just({"mm_hashes": {"image": ["a"]}, "mm_placeholders": {"image": [7]}}),
    st.just([1]),
    st.integers(),
)


@st.composite
def body_tree(draw: st.DrawFn, path: str) -> Obj:
    """A body: the fields routing reads (each maybe absent, wrongly typed or duplicated) and others."""
    field = _FIELDS[path]
    pairs: list[tuple[str, Any]] = []
    if draw(st.integers(0, 9)):  # model present 90 %
        pairs.append(("model", draw(model_value)))
    if draw(st.integers(0, 9)):
        pairs.append((field, draw(messages_value if path == CHAT else prompt_value)))
    if draw(st.booleans()):
        pairs.append(("stream", draw(stream_value)))
    if draw(st.integers(0, 3)) == 0:
        pairs.append(("cache_salt", draw(salt_value)))
    if path == GENERATE and draw(st.booleans()):
        pairs.append(("features", draw(features_value)))
    for name in draw(st.lists(st.sampled_from(["max_tokens", "temperature", "stop", "user", "n"]), max_size=3)):
        pairs.append((name, draw(other_value)))
    pairs = draw(st.permutations(pairs))
    if pairs and draw(st.integers(0, 4)) == 0:  # a duplicate of one of the keys, anywhere
        key = draw(st.sampled_from([k for k, _ in pairs]))
        dup = draw(st.sampled_from([model_value, prompt_value, stream_value, salt_value]))
        pairs.insert(draw(st.integers(0, len(pairs))), (key, draw(dup)))
    return Obj(tuple(pairs))


@st.composite
def damaged(draw: st.DrawFn, text: bytes) -> bytes:
    """``text`` as is (two times in three) or with one byte-level fault."""
    kind = draw(st.sampled_from(["none"] * 14 + ["truncate", "replace", "utf8", "bom", "garbage", "doc", "wrap"]))
    if kind == "truncate" and text:
        return text[: draw(st.integers(0, len(text) - 1))]
    if kind == "replace" and text:
        i = draw(st.integers(0, len(text) - 1))
        return text[:i] + bytes([draw(st.integers(0, 255))]) + text[i + 1 :]
    if kind == "utf8":  # invalid UTF-8 inside the first string, or anywhere
        i = text.find(b'"') + 1
        seq = draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xc0\xaf"]))
        return text[:i] + seq + text[i:]
    if kind == "bom":
        return b"\xef\xbb\xbf" + text
    if kind == "garbage":
        return text + draw(st.sampled_from([b"x", b"}", b",", b"\x00", b"{}", b"\x0c"]))
    if kind == "doc":  # not an object at all
        return draw(st.sampled_from([b"[1,2]", b'"m"', b"null", b"42", b"", b" "]))
    if kind == "wrap":
        return b"[" + text + b"]"
    return text


@st.composite
def request_bodies(draw: st.DrawFn) -> tuple[str, bytes]:
    """(path, body bytes before padding)."""
    path = draw(st.sampled_from(PATHS))
    text = encode(draw(body_tree(path))).encode("utf-8", "surrogatepass")
    return path, draw(damaged(text))


def sized(body: bytes, size: int) -> bytes:
    """``body`` padded with trailing whitespace to at least ``size`` bytes."""
    return body + b" " * max(0, size - len(body))


# --- outcomes ------------------------------------------------------------------------------------


def outcome(parsed: ParsedBody) -> tuple[Any, ...]:
    t = parsed.tokenized
    return (
        "ok",
        parsed.model,
        parsed.stream,
        parsed.body_model,
        None if t is None else (t.model, t.prompts, t.features, t.cache_salt),
    )


def run(parse: Any, *args: Any) -> tuple[Any, ...]:
    """The outcome of a parse: ("ok", …) or ("error", status, message). Any other exception
    propagates: that is a 500 in the service."""
    try:
        return outcome(parse(*args))
    except BadRequestError as exc:
        return ("error", exc.status, exc.message)


def streamed(path: str, body: bytes) -> ParsedBody:
    """What the ext_proc stream does with a body that arrives in ``CHUNK_BYTES`` chunks: feed the
    streaming extractor once 64 KiB have arrived (before end of stream), then its result or the
    ordinary parse."""
    field = token_field_for_path(path)
    prompt: StreamingPrompt | None = None
    received = bytearray()
    for start in range(0, len(body), CHUNK_BYTES):
        received += body[start : start + CHUNK_BYTES]
        last = start + CHUNK_BYTES >= len(body)
        if not last and len(received) >= 64 * 1024 and field is not None:
            prompt = prompt or StreamingPrompt(field)
            prompt.feed(received)
    if prompt is not None:
        result = prompt.finish(bytes(received))
        if result is not None:
            return result[0]
    return parse_body(path, bytes(received))


def reference(path: str, body: bytes) -> ParsedBody:
    return parse_body_reference(path, body)


_SYNTAX = "error unmarshaling request body"


def positionless(result: tuple[Any, ...]) -> tuple[Any, ...]:
    """An outcome without orjson's wording of a syntax error, which trailing whitespace can change
    for a truncated document (``{"a":f`` ends early; ``{"a":f  `` has a bad literal)."""
    if result[0] == "error" and result[2].startswith(_SYNTAX):
        return (result[0], result[1], _SYNTAX)
    return result
