from __future__ import annotations

import orjson
import pytest

from ppc_extproc.errors import BadRequestError
from ppc_extproc.tokens import MultimodalFeature, parse_body
from ppc_extproc.tokens.le32 import tokens_to_le32


def body(**fields) -> bytes:
    return orjson.dumps(fields)


def test_completions_token_prompt() -> None:
    parsed = parse_body("/v1/completions", body(model="m", prompt=[1, 2, 3], stream=True))
    assert parsed.model == "m" and parsed.stream
    assert parsed.tokenized.prompts == (tokens_to_le32([1, 2, 3]),)


def test_batched_token_prompts_are_several_prompts() -> None:
    parsed = parse_body("/v1/completions", body(model="m", prompt=[[1, 2], [3], []]))
    assert parsed.tokenized.prompts == (tokens_to_le32([1, 2]), tokens_to_le32([3]), b"")


@pytest.mark.parametrize("prompt", ["hello", ["a", "b"]])
def test_text_prompts_carry_no_tokens(prompt) -> None:
    assert parse_body("/v1/completions", body(model="m", prompt=prompt)).tokenized is None


def test_chat_carries_no_tokens() -> None:
    parsed = parse_body("/v1/chat/completions", body(model="m", messages=[{"role": "user", "content": "x"}]))
    assert parsed.tokenized is None and parsed.model == "m"


def test_generate_with_multimodal_features_sorted_by_offset() -> None:
    features = {"mm_hashes": {"image": ["b", "a"]}, "mm_placeholders": {"image": [{"offset": 9, "length": 2}, {"offset": 1, "length": 4}]}}
    parsed = parse_body("/inference/v1/generate", body(model="m", token_ids=list(range(12)), features=features))
    assert parsed.tokenized.features == (MultimodalFeature("a", 1, 4), MultimodalFeature("b", 9, 2))
    assert parsed.tokenized.prompts == (tokens_to_le32(range(12)),)


def test_cache_salt_and_model_override() -> None:
    parsed = parse_body("/v1/completions", body(model="m", prompt=[1], cache_salt="s"), model_override="lora-x")
    assert parsed.model == "lora-x" and parsed.tokenized.model == "lora-x" and parsed.tokenized.cache_salt == "s"


def test_integral_floats_are_accepted_as_token_ids() -> None:
    assert parse_body("/v1/completions", b'{"model":"m","prompt":[1.0,2]}').tokenized.prompts == (tokens_to_le32([1, 2]),)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b'{"model":"m","prompt":[1,-2]}', "prompt[1]: token id -2 is outside [0, 2^32)"),
        (b'{"model":"m","prompt":[4294967296]}', "prompt[0]: token id 4294967296 is outside [0, 2^32)"),
        (b'{"model":"m","prompt":[1,2.5]}', "prompt[1]: token id must be an integer, got 2.5"),
        (b'{"model":"m","prompt":[true]}', "prompt[0]: token id must be an integer, got bool"),
        (b'{"model":"m","prompt":[1,[2]]}', "prompt[1]: token id must be an integer, got list"),
        (b'{"model":"m","prompt":[[1],[[2]]]}', "prompt[1][0]: token id must be an integer, got list"),
        (b'{"model":"m","prompt":[[1],2]}', "prompt[1]: expected an array of token ids"),
        (b'{"model":"m","prompt":{"a":1}}', "prompt: unsupported type dict"),
        (b'{"model":"m","token_ids":[[1]]}', "token_ids: unsupported array element type"),
        (b'{"prompt":[1]}', "model not found in request body"),
        (b'{"model":"","prompt":[1]}', "model: expected a non-empty string"),
        (b'{"model":"m","prompt":[1],"cache_salt":3}', "cache_salt: expected a string"),
        (b'{"model":"m","stream":"yes"}', "stream: expected a boolean"),
        (b"no healthy upstream", "error unmarshaling request body"),
        (b"[1,2]", "request body must be a JSON object"),
    ],
)
def test_bad_bodies_name_the_field(raw: bytes, message: str) -> None:
    path = "/inference/v1/generate" if b"token_ids" in raw else "/v1/completions"
    with pytest.raises(BadRequestError) as info:
        parse_body(path, raw)
    assert message in str(info.value)
    assert info.value.status == 400


def test_large_prompt_fast_path_equals_slow_path() -> None:
    tokens = [(i * 7919) % 2**32 for i in range(20000)]
    fast = parse_body("/v1/completions", body(model="m", prompt=tokens))
    slow = parse_body("/v1/completions", body(model="m", prompt=tokens, stop=["["]))  # forces the nesting check
    assert fast.tokenized.prompts == slow.tokenized.prompts == (tokens_to_le32(tokens),)
