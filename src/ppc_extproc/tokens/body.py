"""Request body → model, stream flag and ``TokenizedPrompt``, with 400s that name the field.

Where tokens come from (``ext_proc_protocol.md`` §12):

* ``…/v1/completions``: ``prompt`` as an int array (one prompt) or an array of int arrays (several
  prompts; llm-d rejects this, we support it). A string prompt carries no tokens.
* ``…/inference/v1/generate``: ``token_ids`` plus optional ``features{mm_hashes, mm_placeholders}``.
* ``…/v1/embeddings``: ``input`` as an int array.
* chat, messages, responses: no token ids.

The fast path parses with simdjson and turns token arrays into little-endian uint32 bytes with
numpy, never creating a Python int per token. Anything unusual (floats, bools, nesting, bad
values) falls back to a plain parse whose validation produces the precise error.
"""

from __future__ import annotations

import sys
import threading
from array import array
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import orjson
import simdjson

from ppc_extproc.blockkeys.hashing import tokens_to_le32
from ppc_extproc.errors import BadRequestError
from ppc_extproc.tokens.prompt import MultimodalFeature, TokenizedPrompt

__all__ = ["ParsedBody", "TokenField", "parse_body", "token_field_for_path"]

_UINT32_MAX = 0xFFFFFFFF
#: Below this size a plain orjson parse is cheaper than the simdjson path.
_SMALL_BODY_BYTES = 4096
_BIG_ENDIAN_HOST = sys.byteorder == "big"


@dataclass(frozen=True, slots=True)
class TokenField:
    """Which body field carries token ids for a request path."""

    name: str
    batch_allowed: bool
    features: bool = False


_COMPLETIONS = TokenField("prompt", batch_allowed=True)
_GENERATE = TokenField("token_ids", batch_allowed=False, features=True)
_EMBEDDINGS = TokenField("input", batch_allowed=True)
_NO_TOKEN_SUFFIXES = ("/chat/completions", "/v1/messages", "/v1/responses")


def token_field_for_path(path: str) -> TokenField | None:
    """The token field of a request path (query string ignored); None for token-less APIs."""
    path = path.split("?", 1)[0].rstrip("/")
    if path.endswith("/inference/v1/generate"):
        return _GENERATE
    if path.endswith("/embeddings"):
        return _EMBEDDINGS
    if path.endswith(_NO_TOKEN_SUFFIXES):
        return None
    return _COMPLETIONS  # llm-d's default parser


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


def _fast_parse(body: bytes, field: TokenField | None) -> tuple[dict[str, Any], tuple[bytes, ...] | None]:
    """Scalars of the body and the token arrays as LE32 bytes. Raises _SlowPath or ValueError."""
    parser = _parser()
    try:
        doc = parser.parse(body)
    except RuntimeError:  # an earlier document is still referenced: use a fresh parser
        parser = _local.parser = simdjson.Parser()
        doc = parser.parse(body)
    try:
        if not isinstance(doc, simdjson.Object):
            raise _SlowPath
        scalars: dict[str, Any] = {}
        prompts: tuple[bytes, ...] | None = None
        for key in ("model", "stream", "cache_salt"):
            value = doc.get(key)
            if isinstance(value, (simdjson.Object, simdjson.Array)):
                raise _SlowPath
            if value is not None or key in doc:
                scalars[key] = value
        if field is not None:
            if field.features and "features" in doc and doc["features"] is not None:
                raise _SlowPath
            tokens = doc.get(field.name)
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
        if isinstance(value, float):
            if not value.is_integer():
                raise BadRequestError(f"{where}[{i}]: token id must be an integer, got {value!r}")
            value = int(value)
        if not 0 <= value <= _UINT32_MAX:
            raise BadRequestError(f"{where}[{i}]: token id {value} is outside [0, 2^32)")
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


def parse_body(path: str, body: bytes, *, model_override: str | None = None) -> ParsedBody:
    """Parse a request body. Raises ``BadRequestError`` naming the offending field."""
    field = token_field_for_path(path)
    features: tuple[MultimodalFeature, ...] = ()
    try:
        if len(body) < _SMALL_BODY_BYTES:
            raise _SlowPath  # small bodies: orjson + array('I') beat simdjson's fixed costs
        scalars, prompts = _fast_parse(body, field)
    except (_SlowPath, ValueError, TypeError):
        try:
            obj = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise BadRequestError(f"error unmarshaling request body: {exc}") from None
        if not isinstance(obj, dict):
            raise BadRequestError("request body must be a JSON object") from None
        scalars = {k: obj[k] for k in ("model", "stream", "cache_salt") if k in obj}
        prompts = _slow_prompts(obj, field) if field is not None else None
        if field is not None and field.features:
            features = _features(obj)
    body_model, stream, salt = _scalars(scalars)
    model = model_override or body_model
    if prompts is None:
        return ParsedBody(model, stream, None, body_model)
    return ParsedBody(model, stream, TokenizedPrompt(model, prompts, features, salt), body_model)
