from __future__ import annotations

import orjson
import pytest

from ppc_extproc.blockkeys import TokenProcessor, TokenProcessorConfig
from ppc_extproc.errors import BadRequestError
from ppc_extproc.tokens import parse_body, token_field_for_path
from ppc_extproc.tokens.le32 import tokens_to_le32
from ppc_extproc.tokens.streaming import StreamingPrompt

PROCESSOR = TokenProcessor(TokenProcessorConfig(16))


def stream(body: bytes, chunk: int, path: str = "/v1/completions", rewrite: str | None = None):
    prompt = StreamingPrompt(token_field_for_path(path), PROCESSOR)
    seen = bytearray()
    for i in range(0, len(body), chunk):
        seen += body[i : i + chunk]
        prompt.feed(seen)
    return prompt.finish(bytes(seen), rewrite)


@pytest.mark.parametrize("chunk", [1, 7, 64, 4096, 10**6])
def test_tokens_and_keys_equal_the_ordinary_path_for_any_chunking(chunk: int) -> None:
    tokens = [(i * 7919) % 150000 for i in range(1000)]
    body = orjson.dumps({"model": "m", "prompt": tokens, "max_tokens": 3, "stream": True})
    parsed, keys = stream(body, chunk)
    assert parsed == parse_body("/v1/completions", body)
    assert keys == PROCESSOR.keys(tokens, "m")


def test_whitespace_and_key_order_are_tolerated() -> None:
    body = b'{ "max_tokens" : 3 ,\n "prompt" : [ 1 ,\t2,\n 3 ] , "model": "m" }'
    parsed, keys = stream(body, 5)
    assert parsed.tokenized.prompts == (tokens_to_le32([1, 2, 3]),)
    assert keys is None  # the model came after the prompt: keys are left to the producer


def test_generate_token_ids_field() -> None:
    body = orjson.dumps({"model": "m", "token_ids": list(range(40))})
    parsed, keys = stream(body, 9, "/inference/v1/generate")
    assert parsed.tokenized.prompts == (tokens_to_le32(range(40)),)
    assert keys == PROCESSOR.keys(list(range(40)), "m")


@pytest.mark.parametrize(
    "body",
    [
        b'{"model":"m","prompt":[1,2,]}',
        b'{"model":"m","prompt":[1,,2]}',
        b'{"model":"m","prompt":[[1],[2]]}',
        b'{"model":"m","prompt":[1,-2]}',
        b'{"model":"m","prompt":[1,2.5]}',
        b'{"model":"m","prompt":[1,4294967296]}',
        b'{"model":"m","prompt":[1,true]}',
        b'{"model":"m","x":{"prompt":[1]},"prompt":[5]}',  # a nested "prompt" is not the field
        b'{"model":"m","prompt":"text"}',
        b'{"model":"m","prompt":[1,2]',  # truncated
    ],
)
def test_unusual_bodies_fall_back_to_the_ordinary_path(body: bytes) -> None:
    assert stream(body, 3) is None


def test_salt_rewrite_and_features_drop_precomputed_keys() -> None:
    salted = orjson.dumps({"model": "m", "prompt": list(range(32)), "cache_salt": "s"})
    parsed, keys = stream(salted, 8)
    assert parsed.tokenized.cache_salt == "s" and keys is None
    plain = orjson.dumps({"model": "m", "prompt": list(range(32))})
    parsed, keys = stream(plain, 8, rewrite="lora")
    assert parsed.model == "lora" and parsed.body_model == "m" and keys is None


def test_missing_model_raises_the_same_error() -> None:
    with pytest.raises(BadRequestError, match="model not found in request body"):
        stream(b'{"prompt":[1,2,3]}', 4)
