"""Added-token splitting and the segment cache: per-piece encoding == whole-text encoding."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers, processors

from ppc_extproc.tokenizer.hf import AddedTokenSpec, AddedTokenSplitter, HfTokenizer
from ppc_extproc.tokenizer.segments import ENTRY_OVERHEAD_BYTES, SegmentCache, encode_text


def ids(b: bytes) -> list[int]:
    return np.frombuffer(b, dtype="<u4").tolist()


def pieces_of(splitter: AddedTokenSplitter, text: str) -> list[str]:
    data = text.encode()
    return [data[p.start : p.end].decode() for p in splitter.split(data)[0]]


# --- tokenizers' added_vocabulary.rs cases ------------------------------------------------------------


def test_can_extract_added_tokens() -> None:
    s = AddedTokenSplitter([AddedTokenSpec(0, "[CLS]", special=True), AddedTokenSpec(1, "[SEP]", special=True), AddedTokenSpec(2, "name", normalized=True)])
    # "name" is normalized (a plain added token): left to the library inside the piece.
    assert pieces_of(s, "[CLS] My name is Anthony [SEP]") == ["[CLS]", " My name is Anthony ", "[SEP]"]
    s2 = AddedTokenSplitter([AddedTokenSpec(0, "[CLS]"), AddedTokenSpec(1, "[SEP]"), AddedTokenSpec(2, "name")])
    assert pieces_of(s2, "[CLS] My name is Anthony [SEP]") == ["[CLS]", " My ", "name", " is Anthony ", "[SEP]"]


def test_options_lstrip_rstrip_single_word() -> None:
    text = "I want a <mask> for <mask>  and\t<mask>nothing"
    lstrip = AddedTokenSplitter([AddedTokenSpec(9, "<mask>", lstrip=True)])
    assert pieces_of(lstrip, text) == ["I want a", " <mask>", " for", " <mask>", "  and", "\t<mask>", "nothing"]
    rstrip = AddedTokenSplitter([AddedTokenSpec(9, "<mask>", rstrip=True)])
    assert pieces_of(rstrip, text) == ["I want a ", "<mask> ", "for ", "<mask>  ", "and\t", "<mask>", "nothing"]
    single = AddedTokenSplitter([AddedTokenSpec(9, "<mask>", single_word=True)])
    pieces, rejected = single.split(text.encode())
    assert [text.encode()[p.start : p.end].decode() for p in pieces] == ["I want a ", "<mask>", " for ", "<mask>", "  and\t<mask>nothing"]
    assert rejected  # the last one touches "nothing"


def test_single_word_is_correct() -> None:
    s = AddedTokenSplitter([AddedTokenSpec(0, "<tok>", single_word=True)])
    assert pieces_of(s, "<tok> a") == ["<tok>", " a"]
    assert pieces_of(s, "a<tok>") == ["a<tok>"]
    assert pieces_of(s, "Zürich<tok> x") == ["Zürich<tok> x"]


def test_lstrip_unicode_space() -> None:
    s = AddedTokenSplitter([AddedTokenSpec(0, "<mask>", lstrip=True)])
    assert pieces_of(s, "Hi\u3000<mask> there") == ["Hi", "\u3000<mask>", " there"]


def test_leftmost_longest() -> None:
    s = AddedTokenSplitter([AddedTokenSpec(0, "<|a"), AddedTokenSpec(1, "<|ab|>"), AddedTokenSpec(2, "b|>")])
    assert [(p.token_id) for p in s.split(b"x<|ab|>y")[0]] == [None, 1, None]


# --- position-dependent pre-tokenizers (Metaspace, T7) --------------------------------------------------


def metaspace_dir(tmp: Path, scheme: str) -> Path:
    vocab = {"<unk>": 0, "<s>": 1, "Hello": 2, "▁Hello": 3, "world": 4, "▁world": 5, "▁": 6, "He": 7, "llo": 8}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme=scheme)
    tok.add_special_tokens([AddedToken("<s>", special=True, normalized=False)])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    d = tmp / scheme
    d.mkdir()
    tok.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>"}))
    return d


@pytest.mark.parametrize(
    ("scheme", "expected"),
    [("first", ["<s>", "Hello", "▁world"]), ("always", ["<s>", "▁Hello", "▁world"]), ("never", ["<s>", "Hello", "▁world"])],
)
def test_metaspace_prepend_scheme(tmp_path: Path, scheme: str, expected: list[str]) -> None:
    tok = HfTokenizer.from_dir(metaspace_dir(tmp_path, scheme))
    whole = tok.backend.encode("<s>Hello world", add_special_tokens=False)
    assert whole.tokens == expected
    cache = SegmentCache()
    for _ in range(2):  # cold, then from the cache
        assert ids(encode_text(tok, "<s>Hello world", add_special_tokens=False, cache=cache)) == whole.ids
        assert ids(encode_text(tok, "Hello world<s>Hello world", add_special_tokens=True, cache=cache)) == tok.encode_ids(
            "Hello world<s>Hello world", add_special_tokens=True
        )
    naive = tok.encode_ids("<s>", add_special_tokens=False) + tok.encode_ids("Hello world", add_special_tokens=False)
    assert (naive != whole.ids) == (scheme == "first")


# --- the tiny tokenizer: T4, T5 --------------------------------------------------------------------------


def test_t4_split_pieces_concatenate_to_the_whole(local) -> None:  # type: ignore[no-untyped-def]
    text = "<|bos|><|system|>You are terse.<|eos|><|user|>Hello world, what is a KV cache?<|eos|><|assistant|>"
    tok = local.tokenizer
    concat: list[int] = []
    data = text.encode()
    for p in tok.splitter.split(data)[0]:
        concat += [p.token_id] if p.token_id is not None else tok.encode_ids(data[p.start : p.end].decode(), add_special_tokens=False)
    assert concat == tok.encode_ids(text, add_special_tokens=False)


def test_t5_splitting_elsewhere_is_not_exact(local) -> None:  # type: ignore[no-untyped-def]
    tok = local.tokenizer
    whole = tok.encode_ids("The cache prefix block", add_special_tokens=False)
    halves = tok.encode_ids("The cache pre", add_special_tokens=False) + tok.encode_ids("fix block", add_special_tokens=False)
    assert whole != halves


# --- property: cached == uncached, byte budget respected ---------------------------------------------------

_ALPHABET = st.sampled_from(
    ["<|user|>", "<|eos|>", "<|bos|>", "<|use", "|>", "<|", " ", "  ", "\n", "Hello", " world", "KV", " cache", "é", "日本", "😀", "a", ".", "\t"]
)
_TEXTS = st.lists(_ALPHABET, max_size=40).map("".join)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts=st.lists(_TEXTS, min_size=1, max_size=12), budget=st.integers(0, 4000), special=st.booleans())
def test_cached_equals_uncached(local, texts: list[str], budget: int, special: bool) -> None:  # type: ignore[no-untyped-def]
    tok = local.tokenizer
    cache = SegmentCache(budget)
    for round_ in range(2):
        for t in texts:
            got = ids(encode_text(tok, t, add_special_tokens=special, cache=cache))
            assert got == tok.encode_ids(t, add_special_tokens=special), (round_, t)
            assert cache.stats().bytes <= budget
    st_ = cache.stats()
    assert st_.bytes == sum(len(k) + len(v) + ENTRY_OVERHEAD_BYTES for k, v in cache._data.items())


def test_shared_prefix_is_encoded_once(local) -> None:  # type: ignore[no-untyped-def]
    tok = local.tokenizer
    cache = SegmentCache()
    context = "A long retrieved document about KV caches and routers. " * 50
    first = f"<|bos|><|system|>{context}<|eos|><|user|>question one<|eos|><|assistant|>"
    second = f"<|bos|><|system|>{context}<|eos|><|user|>question two, longer than sixteen<|eos|><|assistant|>"
    encode_text(tok, first, add_special_tokens=False, cache=cache)
    before = cache.stats()
    assert ids(encode_text(tok, second, add_special_tokens=False, cache=cache)) == tok.encode_ids(second, add_special_tokens=False)
    after = cache.stats()
    assert after.hits - before.hits == 1 and after.misses - before.misses == 1


def test_eviction_is_lru_by_bytes() -> None:
    cache = SegmentCache(3 * (17 + 8 + ENTRY_OVERHEAD_BYTES))
    keys = [bytes([i]) * 17 for i in range(4)]
    cache.put_many([(k, b"12345678") for k in keys[:3]])
    assert cache.get_many([keys[0]]) == [b"12345678"]  # 0 becomes the youngest
    cache.put_many([(keys[3], b"12345678")])
    assert cache.get_many(keys) == [b"12345678", None, b"12345678", b"12345678"]
    assert cache.stats().evictions == 1
