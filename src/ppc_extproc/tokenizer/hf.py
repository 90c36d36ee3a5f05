"""A ``tokenizer.json`` loaded with HF ``tokenizers``, split on added tokens exactly as the library does.

``tokenizers`` encodes a text in this order (``huggingface/tokenizers:
tokenizers/src/tokenizer/mod.rs`` ``encode_single_sequence``): find the non-normalized added tokens
in the raw text (``added_vocabulary.rs`` ``find_matches``: Aho-Corasick, leftmost-longest, then
``single_word``/``lstrip``/``rstrip``), normalize and pre-tokenize each piece between matches, run
the model per piece, post-process the whole sequence. The pieces never influence each other, so

    encode(text) == concat(ids(piece) for piece in split(text)) [+ post-processor tokens]

which is what makes a per-piece cache exact. A piece's ids can depend on its position: Metaspace
``prepend_scheme: "first"`` prepends ``▁`` only to the piece at offset 0 of the text. A piece not
at offset 0 is therefore encoded behind a *sentinel* (an added token that strips nothing): the
library sees it at a non-zero offset and the sentinel's id is dropped. Normalized added tokens are
matched by the library inside each piece, exactly as in a whole-text encode.

``HfTokenizer`` is immutable after construction and safe to share between threads.
"""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import tokenizers
from tokenizers import Tokenizer

from ppc_extproc.errors import ConfigError

__all__ = ["AddedTokenSpec", "AddedTokenSplitter", "HfTokenizer", "Piece"]

#: Named special tokens transformers (v5) passes to chat templates (``SPECIAL_TOKENS_ATTRIBUTES``).
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")

# The Rust regex classes of added_vocabulary.rs (``\w$``, ``^\w``, ``\s*$``, ``^\s*``): Unicode
# White_Space, and Alphabetic | Mark | Decimal_Number | Connector_Punctuation | Join_Control.
_WHITE_SPACE = frozenset(
    "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
    "\u2028\u2029\u202f\u205f\u3000"
)


def _is_word(ch: str) -> bool:
    return ch.isalnum() or ch == "_" or ch in "\u200c\u200d" or unicodedata.category(ch) in ("Mn", "Mc", "Me", "Pc")


def _char_before(data: bytes, i: int) -> str:
    """The character that ends at byte ``i`` of UTF-8 ``data``."""
    j = i - 1
    while j > 0 and data[j] & 0xC0 == 0x80:
        j -= 1
    return data[j:i].decode("utf-8", "surrogatepass")


def _char_at(data: bytes, i: int) -> str:
    """The character that starts at byte ``i`` of UTF-8 ``data``."""
    j = i + 1
    while j < len(data) and data[j] & 0xC0 == 0x80:
        j += 1
    return data[i:j].decode("utf-8", "surrogatepass")


def _space_run_start(data: bytes, end: int) -> int:
    """Start of the whitespace run that ends at byte ``end`` (``end`` if none)."""
    i = end
    while i > 0:
        ch = _char_before(data, i)
        if ch not in _WHITE_SPACE:
            break
        i -= len(ch.encode("utf-8"))
    return i


def _space_run_end(data: bytes, start: int) -> int:
    """End of the whitespace run that starts at byte ``start``."""
    i = start
    while i < len(data):
        ch = _char_at(data, i)
        if ch not in _WHITE_SPACE:
            break
        i += len(ch.encode("utf-8"))
    return i


@dataclass(frozen=True, slots=True)
class AddedTokenSpec:
    """One entry of ``tokenizer.json`` ``added_tokens`` with the flags that steer matching."""

    id: int
    content: str
    single_word: bool = False
    lstrip: bool = False
    rstrip: bool = False
    normalized: bool = False
    special: bool = False


class Piece(NamedTuple):
    """A byte span of the UTF-8 text: an added token (``token_id`` set) or text the model tokenizes."""

    start: int
    end: int
    token_id: int | None


class AddedTokenSplitter:
    """``AddedVocabulary::find_matches`` over the non-normalized added tokens of a tokenizer."""

    def __init__(self, tokens: Sequence[AddedTokenSpec], *, encode_special_tokens: bool = False) -> None:
        by_content: dict[bytes, AddedTokenSpec] = {}
        for t in tokens:
            if t.content and not t.normalized and not (encode_special_tokens and t.special):
                by_content[t.content.encode("utf-8")] = t
        self._by_content = by_content
        self.has_single_word = any(t.single_word for t in by_content.values())
        # Matching runs on UTF-8 bytes (prefix-free: a match always starts at a character). A
        # literal alternation tried longest first is leftmost-longest, like MatchKind::LeftmostLongest.
        contents = sorted(by_content, key=lambda c: (-len(c), c))
        self._pattern = re.compile(b"|".join(re.escape(c) for c in contents)) if contents else None
        # Candidates can only start at the first byte the tokens share: bytes.find finds it at
        # memchr speed and the alternation is tried there only (same matches as finditer).
        firsts = {c[:1] for c in contents}
        self._prefix: bytes = firsts.pop() if len(firsts) == 1 else b""

    @property
    def empty(self) -> bool:
        return self._pattern is None

    def _candidates(self, pattern: re.Pattern[bytes], data: bytes) -> Iterator[re.Match[bytes]]:
        """Non-overlapping leftmost-longest matches, like ``pattern.finditer(data)``."""
        prefix = self._prefix
        if not prefix:
            yield from pattern.finditer(data)
            return
        find, match = data.find, pattern.match
        pos = find(prefix)
        while pos >= 0:
            m = match(data, pos)
            if m is None:
                pos = find(prefix, pos + 1)
            else:
                yield m
                pos = find(prefix, m.end())

    def split(self, data: bytes) -> tuple[list[Piece], bool]:
        """Byte pieces covering UTF-8 ``data`` and whether a ``single_word`` candidate was rejected.

        A rejected candidate makes per-piece encoding context-dependent; callers then encode the
        whole text instead.
        """
        pattern = self._pattern
        n = len(data)
        if pattern is None or not data:
            return ([Piece(0, n, None)] if data else []), False
        pieces: list[Piece] = []
        rejected = False
        pos = 0
        by_content = self._by_content
        for m in self._candidates(pattern, data):
            start, stop = m.span()
            tok = by_content[m.group()]
            if tok.single_word:
                start_space = start == 0 or not _is_word(_char_before(data, start))
                stop_space = stop == n or not _is_word(_char_at(data, stop))
                if not (start_space and stop_space):
                    rejected = True
                    continue
            if tok.lstrip:
                start = max(_space_run_start(data, start), pos)
            if tok.rstrip:
                stop = _space_run_end(data, stop)
            if pos < start:
                pieces.append(Piece(pos, start, None))
            pieces.append(Piece(start, stop, tok.id))
            pos = stop
        if pos != n:
            pieces.append(Piece(pos, n, None))
        return pieces, rejected


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(str(path), f"cannot read: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(str(path), "expected a JSON object")
    return data


def _token_text(value: Any) -> str | None:
    """A special token in ``tokenizer_config.json``: a string or an ``AddedToken`` dict."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def _le32(ids: Sequence[int]) -> bytes:
    return np.asarray(ids, dtype="<u4").tobytes()


class HfTokenizer:
    """``tokenizer.json`` + ``tokenizer_config.json`` of a model directory, with piece-wise encoding."""

    def __init__(self, tokenizer: Tokenizer, config: dict[str, Any], *, fingerprint: bytes) -> None:
        self._tok = tokenizer
        self.config = config
        #: 16 bytes identifying tokenizer files and library version (cache keys).
        self.fingerprint = fingerprint
        if config.get("split_special_tokens"):
            tokenizer.encode_special_tokens = True
        added = [
            AddedTokenSpec(
                id=int(i), content=t.content, single_word=t.single_word, lstrip=t.lstrip,
                rstrip=t.rstrip, normalized=t.normalized, special=t.special,
            )
            for i, t in sorted(tokenizer.get_added_tokens_decoder().items())
        ]
        self.added_tokens = tuple(added)
        self.splitter = AddedTokenSplitter(added, encode_special_tokens=tokenizer.encode_special_tokens)
        self.special_tokens_map = {
            name: text for name in SPECIAL_TOKEN_NAMES if (text := _token_text(config.get(name))) is not None
        }
        self._sentinel = self._pick_sentinel(added)
        self._prefix: tuple[int, ...] | None
        self._suffix: tuple[int, ...] | None
        self._prefix, self._suffix = self._post_processor_ids()

    @classmethod
    def from_dir(cls, directory: str | Path) -> HfTokenizer:
        """Load ``DIR/tokenizer.json`` (required) and ``DIR/tokenizer_config.json`` (optional)."""
        path = Path(directory)
        tj = path / "tokenizer.json"
        if not tj.is_file():
            raise ConfigError(str(path), "tokenizer.json not found")
        raw = tj.read_bytes()
        try:
            tok = Tokenizer.from_str(raw.decode("utf-8"))
        except Exception as exc:  # tokenizers raises a bare Exception on bad files
            raise ConfigError(str(tj), f"cannot load: {exc}") from None
        cfg_path = path / "tokenizer_config.json"
        cfg_raw = cfg_path.read_bytes() if cfg_path.is_file() else b""
        config = _read_json(cfg_path) if cfg_raw else {}
        digest = hashlib.sha256()
        for part in (raw, cfg_raw, tokenizers.__version__.encode(), b"transformers-5"):
            digest.update(len(part).to_bytes(8, "little"))
            digest.update(part)
        return cls(tok, config, fingerprint=digest.digest()[:16])

    @property
    def backend(self) -> Tokenizer:
        """The underlying ``tokenizers.Tokenizer`` (for parity checks)."""
        return self._tok

    def _pick_sentinel(self, added: Sequence[AddedTokenSpec]) -> int | None:
        for t in added:
            if t.content and not t.normalized and not t.rstrip and not t.single_word:
                ids = self._tok.encode(t.content, add_special_tokens=False).ids
                if ids == [t.id]:
                    return t.id
        return None

    def _post_processor_ids(self) -> tuple[tuple[int, ...], tuple[int, ...]] | tuple[None, None]:
        """Ids the post-processor puts before and after a single sequence, if constant."""
        found: set[tuple[tuple[int, ...], tuple[int, ...]]] = set()
        for probe in ("a b", "Hello, world.", "x"):
            bare = self._tok.encode(probe, add_special_tokens=False).ids
            full = self._tok.encode(probe, add_special_tokens=True).ids
            k = next((i for i in range(len(full) - len(bare) + 1) if full[i : i + len(bare)] == bare), None)
            if k is None or not bare:
                return None, None
            found.add((tuple(full[:k]), tuple(full[k + len(bare) :])))
        if len(found) != 1:
            return None, None
        return found.pop()

    # --- encoding -----------------------------------------------------------------------------

    def encode_ids(self, text: str, *, add_special_tokens: bool) -> list[int]:
        """Whole-text encode (reference; the uncached path)."""
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens).ids)

    def special_ids(self, add_special_tokens: bool) -> tuple[bytes, bytes] | None:
        """LE32 bytes the post-processor adds before/after, or None if not expressible as such."""
        if not add_special_tokens:
            return b"", b""
        if self._prefix is None or self._suffix is None:
            return None
        return _le32(self._prefix), _le32(self._suffix)

    @property
    def piecewise(self) -> bool:
        """Whether pieces not at offset 0 can be encoded on their own (a sentinel exists)."""
        return self._sentinel is not None or self.splitter.empty

    def encode_pieces(self, pieces: Sequence[tuple[str, bool]]) -> list[bytes]:
        """LE32 ids of each ``(text, at_offset_0)`` piece, as inside a whole-text encode."""
        if not pieces:
            return []
        sentinel = self._sentinel
        sentinel_text = self._tok.id_to_token(sentinel) if sentinel is not None else None
        texts: list[str] = []
        for text, first in pieces:
            if first:
                texts.append(text)
            else:
                if sentinel_text is None:
                    raise RuntimeError("no sentinel token: pieces not at offset 0 cannot be encoded alone")
                texts.append(sentinel_text + text)
        encs = self._tok.encode_batch_fast(texts, add_special_tokens=False) if len(texts) > 1 else [
            self._tok.encode(texts[0], add_special_tokens=False)
        ]
        out: list[bytes] = []
        for (_, first), enc in zip(pieces, encs):
            ids = enc.ids
            if not first:
                if not ids or ids[0] != sentinel:
                    raise RuntimeError("sentinel token not found at the start of a piece encode")
                ids = ids[1:]
            out.append(_le32(ids))
        return out
