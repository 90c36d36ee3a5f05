"""Request body → model, stream flag and ``TokenizedPrompt``, with 400s that name the field.

Where tokens come from (the request types of vLLM's OpenAI-compatible server,
``vllm-project/vllm: vllm/entrypoints/openai/protocol.py``; which path is which is the table in
``ppc_extproc.tokens.paths``):

* ``…/v1/completions``: ``prompt`` as an int array (one prompt) or an array of int arrays (several
  prompts; llm-d rejects this, we support it). A string prompt carries no tokens.
* ``…/inference/v1/generate``: ``token_ids`` plus optional ``features{mm_hashes, mm_placeholders}``.
* ``…/v1/embeddings``: ``input`` as an int array.
* chat, messages, responses: no token ids.

The fast path finds the token array (``"prompt": [``), reads it as little-endian uint32 bytes in one
call (``ppc_extproc.native``: C when built), replaces it by a sentinel string and lets orjson parse
the (small) rest; the result is used only if the sentinel is the top-level field's value, so orjson
decides the grammar and duplicate keys. Batches and anything the array reader refuses take the
simdjson path, which turns token arrays into little-endian uint32 bytes with numpy. Neither ever
creates a Python int per token. The fast paths only ever *accept*: anything it does not handle
itself (floats, bools, nesting, bad values, duplicate keys, documents simdjson refuses) falls back
to the plain orjson parse, whose validation produces the precise error. So orjson's grammar
(RFC 8259: no NaN/Infinity, no BOM, valid UTF-8 without lone surrogates, depth ≤ 1024) and one
set of validators decide every body, whatever its size; integers beyond 64 bits are numbers like
any other (a 400 only in a field we read). Duplicate keys resolve as Python's ``json`` (which vLLM
parses with) and orjson resolve them: the last one wins.
"""

from __future__ import annotations

import os
import re
import sys
import threading
from array import array
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import orjson
import simdjson

from ppc_extproc.errors import BadRequestError
from ppc_extproc.tokens.le32 import tokens_to_le32
from ppc_extproc.tokens.paths import TokenField, token_field_for_path
from ppc_extproc.tokens.prompt import MultimodalFeature, TokenizedPrompt
from ppc_extproc.tokens.recent_arrays import RECENT_ARRAYS

__all__ = [
    "ParsedBody",
    "TokenField",
    "json_object",
    "parse_body",
    "parse_body_reference",
    "parsed_from_object",
    "sentinel_parse",
    "token_field_for_path",
]

_UINT32_MAX = 0xFFFFFFFF
#: Below this size a plain orjson parse is cheaper than the simdjson path.
_SMALL_BODY_BYTES = 4096
_BIG_ENDIAN_HOST = sys.byteorder == "big"
#: simdjson skips a UTF-8 byte order mark; orjson (the reference) refuses it.
_BOM = b"\xef\xbb\xbf"
#: The top-level fields every path reads besides the token field.
_SCALAR_KEYS = ("model", "stream", "cache_salt")
#: Stands for the token array while orjson parses the rest of a body (unguessable: random per process).
SENTINEL = "\u0000ppc-extproc-token-array-" + os.urandom(8).hex()
SENTINEL_JSON = orjson.dumps(SENTINEL)
_KEY_PATTERNS: dict[str, re.Pattern[bytes]] = {}


def key_pattern(name: str) -> re.Pattern[bytes]:
    """``"<name>": [`` (the start of a token array) as a compiled pattern."""
    pattern = _KEY_PATTERNS.get(name)
    if pattern is None:
        pattern = _KEY_PATTERNS[name] = re.compile(rb'"' + re.escape(name.encode()) + rb'"\s*:\s*\[')
    return pattern


@dataclass(frozen=True, slots=True)
class ParsedBody:
    """What routing needs from a request body."""

    #: Model routing and hashing use (the rewrite target when one applies).
    model: str
    stream: bool
    #: None when the body carries no token ids (string prompt, chat): no prefix score.
    tokenized: TokenizedPrompt | None
    #: The body's own ``model`` (differs from ``model`` when rewritten).
    body_model: str = ""
    #: The body as a JSON object when the parse built one (the reference path), so that nothing
    #: downstream parses it again; None when a fast path read only what routing needs.
    obj: dict[str, Any] | None = None


# --- fast path --------------------------------------------------------------------------------

_local = threading.local()


def _parser() -> simdjson.Parser:
    parser = getattr(_local, "parser", None)
    if parser is None:
        parser = _local.parser = simdjson.Parser()
    return parser


class _SlowPath(Exception):
    """The fast path met something it does not validate itself."""


def _array_le32(array: Any) -> bytes:
    if not isinstance(array, simdjson.Array):
        raise _SlowPath  # a string or object inside a batch of prompts
    n = len(array)
    if n == 0:
        return b""
    try:
        values = np.frombuffer(array.as_buffer(of_type="u"), dtype=np.uint64)
    except (TypeError, ValueError):
        raise _SlowPath from None
    if values.size != n or int(values.max()) > _UINT32_MAX:  # nested arrays flatten; out of range
        raise _SlowPath
    return values.astype("<u4").tobytes()


def _count_brackets(body: bytes, limit: int) -> int:
    """Occurrences of '[' in ``body``, counting no further than ``limit`` (memchr-fast)."""
    count, pos = 0, body.find(b"[")
    while pos >= 0 and count < limit:
        count += 1
        pos = body.find(b"[", pos + 1)
    return count


def _document(body: bytes) -> Any:
    """simdjson's DOM of ``body``; ``_SlowPath`` whenever simdjson refuses it, so that orjson decides
    (and words) the outcome. simdjson raises ValueError for invalid JSON and RuntimeError both for
    its own limits (integers beyond 64 bits, depth) and for a thread parser that an earlier
    document still references — a fresh parser tells the two apart."""
    if body.startswith(_BOM):
        raise _SlowPath
    try:
        return _parser().parse(body)
    except ValueError:
        raise _SlowPath from None
    except RuntimeError:
        pass
    parser = _local.parser = simdjson.Parser()
    try:
        return parser.parse(body)
    except (ValueError, RuntimeError):
        raise _SlowPath from None


def _fast_parse(body: bytes, field: TokenField | None) -> tuple[dict[str, Any], tuple[bytes, ...] | None]:
    """Scalars of the body and the token arrays as LE32 bytes. Raises _SlowPath for anything else."""
    doc = _document(body)
    try:
        if not isinstance(doc, simdjson.Object):
            raise _SlowPath
        names = list(doc)
        present = set(names)
        if len(present) != len(names):
            raise _SlowPath  # duplicate keys: simdjson finds the first, vLLM uses the last
        scalars: dict[str, Any] = {}
        prompts: tuple[bytes, ...] | None = None
        for key in _SCALAR_KEYS:
            if key in present:
                value = doc[key]
                if isinstance(value, (simdjson.Object, simdjson.Array)):
                    raise _SlowPath
                scalars[key] = value
        if field is not None and field.features and "features" in present and doc["features"] is not None:
            raise _SlowPath
        if field is not None and field.name in present:
            tokens = doc[field.name]
            if isinstance(tokens, simdjson.Array):
                if len(tokens) and isinstance(tokens[0], simdjson.Array):
                    if not field.batch_allowed:
                        raise _SlowPath
                    prompts = tuple(_array_le32(inner) for inner in tokens)
                    brackets = 1 + len(prompts)
                else:
                    prompts = (_array_le32(tokens),)
                    brackets = 1
                # as_buffer flattens nested arrays; a flat array has no '[' beyond the expected ones.
                if _count_brackets(body, brackets + 1) > brackets and cast(bytes, tokens.mini).count(b"[") != brackets:
                    raise _SlowPath
            elif tokens is not None and not isinstance(tokens, str):
                raise _SlowPath
        return scalars, prompts
    finally:
        del doc


# --- slow path: plain objects, precise errors -----------------------------------------------------


def _token_list(values: Any, where: str) -> bytes:
    if not isinstance(values, list):
        raise BadRequestError(f"{where}: expected an array of token ids")
    try:  # the common case in C: ints in [0, 2^32); anything else raises
        packed = array("I", values)
    except (TypeError, OverflowError):
        pass
    else:
        if not any(v is True or v is False for v in values):
            if _BIG_ENDIAN_HOST:  # pragma: no cover
                packed.byteswap()
            return packed.tobytes()
    ids = []
    for i, value in enumerate(values):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise BadRequestError(f"{where}[{i}]: token id must be an integer, got {type(value).__name__}")
        if isinstance(value, float) and not value.is_integer():
            raise BadRequestError(f"{where}[{i}]: token id must be an integer, got {value!r}")
        if not 0 <= value <= _UINT32_MAX:  # orjson reads integers beyond 64 bits as floats: shown as such
            raise BadRequestError(f"{where}[{i}]: token id {value!r} is outside [0, 2^32)")
        value = int(value)
        ids.append(value)
    return tokens_to_le32(ids)


def _slow_prompts(obj: dict[str, Any], field: TokenField) -> tuple[bytes, ...] | None:
    value = obj.get(field.name)
    if value is None or isinstance(value, str):
        return None
    if not isinstance(value, list):
        raise BadRequestError(f"{field.name}: unsupported type {type(value).__name__}")
    if not value:
        return (b"",)
    if isinstance(value[0], str) and all(isinstance(v, str) for v in value):
        return None  # a batch of text prompts: no token ids
    if isinstance(value[0], list):
        if not field.batch_allowed:
            raise BadRequestError(f"{field.name}: unsupported array element type")
        return tuple(_token_list(inner, f"{field.name}[{i}]") for i, inner in enumerate(value))
    return (_token_list(value, field.name),)


def _features(obj: dict[str, Any]) -> tuple[MultimodalFeature, ...]:
    features = obj.get("features")
    if features is None:
        return ()
    if not isinstance(features, dict):
        raise BadRequestError("features: expected an object")
    hashes = features.get("mm_hashes") or {}
    placeholders = features.get("mm_placeholders") or {}
    if not isinstance(hashes, dict) or not isinstance(placeholders, dict):
        raise BadRequestError("features: mm_hashes and mm_placeholders must be objects keyed by modality")
    items: list[MultimodalFeature] = []
    for modality, ids in hashes.items():
        spans = placeholders.get(modality) or []
        if not isinstance(ids, list) or not isinstance(spans, list):
            raise BadRequestError(f"features.mm_hashes.{modality}: expected arrays")
        for i, (ident, span) in enumerate(zip(ids, spans)):
            where = f"features.mm_placeholders.{modality}[{i}]"
            if not isinstance(ident, str):
                raise BadRequestError(f"features.mm_hashes.{modality}[{i}]: expected a string")
            if not isinstance(span, dict):
                raise BadRequestError(f"{where}: expected {{offset, length}}")
            values = {}
            for name in ("offset", "length"):
                v = span.get(name)
                if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                    raise BadRequestError(f"{where}.{name}: expected a non-negative integer")
                values[name] = v
            items.append(MultimodalFeature(ident, values["offset"], values["length"]))
    return tuple(sorted(items, key=lambda f: f.offset))


# --- entry point ----------------------------------------------------------------------------------


def _scalars(scalars: dict[str, Any]) -> tuple[str, bool, str | None]:
    model = scalars.get("model")
    if model is None:
        raise BadRequestError("model not found in request body")
    if not isinstance(model, str) or not model:
        raise BadRequestError("model: expected a non-empty string")
    stream = scalars.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise BadRequestError("stream: expected a boolean")
    salt = scalars.get("cache_salt")
    if salt is not None and not isinstance(salt, str):
        raise BadRequestError("cache_salt: expected a string")
    return model, stream, salt or None


def _parsed(
    scalars: dict[str, Any],
    prompts: tuple[bytes, ...] | None,
    features: tuple[MultimodalFeature, ...],
    model_override: str | None,
    obj: dict[str, Any] | None = None,
) -> ParsedBody:
    body_model, stream, salt = _scalars(scalars)
    model = model_override or body_model
    if prompts is None:
        return ParsedBody(model, stream, None, body_model, obj)
    return ParsedBody(model, stream, TokenizedPrompt(model, prompts, features, salt), body_model, obj)


def parsed_from_object(
    obj: dict[str, Any],
    field: TokenField | None,
    prompts: tuple[bytes, ...] | None,
    model_override: str | None = None,
    *,
    whole: bool = False,
) -> ParsedBody:
    """A ``ParsedBody`` from a body parsed by orjson whose token arrays are already ``prompts``:
    features, then model, stream and cache_salt are validated — in the order every path uses, so
    a body with several faults names the same field whichever path reads it. ``whole``: ``obj``
    is the entire body (not the sentinel-substituted rest) and is kept in the result."""
    features = _features(obj) if field is not None and field.features else ()
    scalars = {k: obj[k] for k in _SCALAR_KEYS if k in obj}
    return _parsed(scalars, prompts, features, model_override, obj if whole else None)


def sentinel_rest(body: bytes | bytearray, start: int, end: int, field: TokenField) -> dict[str, Any] | None:
    """The body with ``body[start:end + 1]`` (the token array) replaced by the sentinel, parsed by
    orjson; None unless that is valid JSON whose top-level ``field`` is the sentinel."""
    try:
        obj = orjson.loads(body[:start] + SENTINEL_JSON + body[end + 1 :])
    except orjson.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or obj.get(field.name) != SENTINEL:
        return None
    return obj


def sentinel_parse(body: bytes, field: TokenField, model_override: str | None = None) -> ParsedBody | None:
    """The fast path for one flat token array (module docstring), or None for the other paths."""
    match = key_pattern(field.name).search(body)
    if match is None:
        return None
    start = match.end() - 1
    found = RECENT_ARRAYS.read(body, start)
    if found is None:
        return None
    tokens, end = found
    obj = sentinel_rest(body, start, end, field)
    if obj is None:
        return None
    return parsed_from_object(obj, field, (tokens,), model_override)


def parse_body(path: str, body: bytes, *, model_override: str | None = None) -> ParsedBody:
    """Parse a request body. Raises ``BadRequestError`` naming the offending field."""
    if len(body) >= _SMALL_BODY_BYTES:  # small bodies: orjson + array('I') beat simdjson's fixed costs
        field = token_field_for_path(path)
        if field is not None:  # orjson refuses a BOM: such a body falls through to the same 400
            parsed = sentinel_parse(body, field, model_override)
            if parsed is not None:
                return parsed
        try:
            scalars, prompts = _fast_parse(body, field)
        except _SlowPath:
            pass
        else:
            return _parsed(scalars, prompts, (), model_override)
    return parse_body_reference(path, body, model_override=model_override)


def parse_body_reference(path: str, body: bytes, *, model_override: str | None = None) -> ParsedBody:
    """The orjson path alone (what bodies under 4 KiB take, and what the fast paths fall back to):
    the behaviour every other path must reproduce exactly, errors included."""
    field = token_field_for_path(path)
    obj = json_object(body)
    prompts = _slow_prompts(obj, field) if field is not None else None
    return parsed_from_object(obj, field, prompts, model_override, whole=True)


def json_object(body: bytes | bytearray | memoryview) -> dict[str, Any]:
    """``body`` parsed as a JSON object by the reference parser (orjson: RFC 8259, duplicate keys
    last-wins), or the 400 every body path answers for anything else."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadRequestError(f"error unmarshaling request body: {exc}") from None
    if not isinstance(obj, dict):
        raise BadRequestError("request body must be a JSON object")
    return obj
