"""Extract (and hash) a body's token array while the body streams in.

A 100K-token body is ~600 KB of JSON; parsing it and hashing its blocks after the last chunk
arrives costs milliseconds that the routing decision then waits for. Instead, as chunks arrive:

1. find ``"<field>": [`` (``prompt`` or ``token_ids``) in the bytes seen so far;
2. convert each run of complete numbers (up to the last comma) to little-endian uint32 in one
   call (``ppc_extproc.native``), never creating Python ints;
3. hash the full blocks with the producer's token processor, chaining from the previous block.

At the end of the body, ``finish`` validates the whole document cheaply: the array's text is
replaced by a sentinel string and the (small) rest is parsed by orjson; the result is used only if
the sentinel is the top-level field's value. That makes orjson the arbiter here too: the same
grammar as every other path, and duplicate keys resolved as vLLM resolves them (the last wins —
a later duplicate of the field is not the sentinel). Anything unusual — nested or batched
prompts, floats, negative ids, a ``"prompt"`` inside some other value, salt or multimodal
features that change block 0 — makes ``finish`` return None (or drop the precomputed keys), and
the caller takes the ordinary path (``parse_body``), which also produces the precise 400 message.
The rest is validated by ``parsed_from_object``, in the order ``parse_body`` uses.
"""

from __future__ import annotations

import re
from typing import Protocol

import orjson

from ppc_extproc import native
from ppc_extproc.ids import RequestKey
from ppc_extproc.tokens.body import ParsedBody, TokenField, key_pattern, parsed_from_object, sentinel_rest

__all__ = ["BlockHasher", "StreamingPrompt"]

#: Give up looking for the token array once this much body has gone by without it.
_SEARCH_LIMIT = 1 << 20
_MODEL = re.compile(rb'"model"\s*:\s*("(?:[^"\\]|\\.)*")')



class BlockHasher(Protocol):
    """What streaming needs of a token processor (``blockkeys.TokenProcessor`` is one)."""

    @property
    def block_size(self) -> int: ...

    def keys(self, tokens: memoryview, model: str, *, parent: int = 0) -> list[RequestKey]: ...


class StreamingPrompt:
    """Incremental token extraction for one request body, hashing full blocks with ``hasher``."""

    def __init__(self, field: TokenField, hasher: BlockHasher | None = None) -> None:
        self.field = field
        self._key = key_pattern(field.name)
        self._hasher = hasher
        self._search_from = 0
        self._array_start: int | None = None  # index of the '['
        self._array_end: int | None = None  # index of the ']'
        self._scan = 0
        self._segments = 0
        self._tokens = bytearray()
        self._abandoned = False
        self._model_guess: str | None = None
        self._keys: list[RequestKey] = []

    @property
    def abandoned(self) -> bool:
        return self._abandoned

    def feed(self, body: bytearray | bytes) -> None:
        """Advance over the body received so far (the whole buffer, not just the new chunk)."""
        if self._abandoned or self._array_end is not None:
            return
        if self._array_start is None and not self._find_array(body):
            return
        start = self._array_start
        assert start is not None
        if self._scan == start + 1:  # nothing converted yet: try the whole array at once
            whole = native.json_uint32_array(body, start)
            if whole is not None:
                self._tokens += whole[0]
                self._array_end = whole[1]
                self._hash_full_blocks()
                return
        end = body.find(b"]", self._scan)
        if end >= 0:
            self._convert(body[self._scan : end], final=True)
            self._array_end = end
        else:
            cut = body.rfind(b",", self._scan)
            if cut < 0:
                return
            self._convert(body[self._scan : cut], final=False)
            self._scan = cut + 1
        self._hash_full_blocks()

    def finish(
        self, body: bytes, model_override: str | None = None
    ) -> tuple[ParsedBody, list[RequestKey] | None] | None:
        """The parsed body and its block keys (None: not precomputed), or None for the ordinary path."""
        self.feed(body)
        if self._abandoned or self._array_start is None or self._array_end is None:
            return None
        obj = sentinel_rest(body, self._array_start, self._array_end, self.field)
        if obj is None:
            return None
        # Raises BadRequestError exactly as parse_body would for this body.
        parsed = parsed_from_object(obj, self.field, (bytes(self._tokens),), model_override)
        tokenized = parsed.tokenized
        assert tokenized is not None
        if self._hasher is None or parsed.model != self._model_guess or tokenized.cache_salt or tokenized.features:
            return parsed, None
        self._hash_full_blocks()
        return parsed, self._keys

    # --- internals -------------------------------------------------------------------------------

    def _find_array(self, body: bytearray | bytes) -> bool:
        match = self._key.search(body, max(0, self._search_from - 64))
        if match is None:
            self._search_from = len(body)
            if len(body) > _SEARCH_LIMIT:
                self._abandoned = True
            return False
        self._array_start = match.end() - 1
        self._scan = match.end()
        head = _MODEL.search(body, 0, match.start())
        if head is not None:
            try:
                self._model_guess = orjson.loads(head.group(1))
            except orjson.JSONDecodeError:
                self._model_guess = None
        return True

    def _convert(self, segment: bytes | bytearray, *, final: bool) -> None:
        if not segment.strip():
            # "[]" is an empty prompt; an empty segment anywhere else is ",," or ",]": not JSON.
            if not (final and self._segments == 0):
                self._abandoned = True
            return
        self._segments += 1
        if b"[" in segment:
            self._abandoned = True  # nested arrays: a batch of prompts, or invalid
            return
        converted = native.json_uint32_array(b"[" + segment + b"]", 0)
        if converted is None:  # floats, signs, exponents, out of range, ...
            self._abandoned = True
            return
        self._tokens += converted[0]

    def _hash_full_blocks(self) -> None:
        hasher = self._hasher
        if hasher is None or self._model_guess is None or self._abandoned:
            return
        block_bytes = hasher.block_size * 4
        done = len(self._keys) * block_bytes
        full = len(self._tokens) // block_bytes * block_bytes
        if full > done:
            parent = self._keys[-1] if self._keys else 0
            self._keys.extend(hasher.keys(memoryview(self._tokens)[done:full], self._model_guess, parent=parent))
