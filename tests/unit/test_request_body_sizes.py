"""The bodies of issue #11 (F1, F3): the same answer under and over 4 KiB, and through the
streaming extractor (over 64 KiB, in chunks). The generated version is ``tests/reliability``."""

from __future__ import annotations

import pytest

from ppc_extproc.errors import BadRequestError
from ppc_extproc.tokens import ParsedBody, parse_body
from ppc_extproc.tokens.body import token_field_for_path
from ppc_extproc.tokens.le32 import tokens_to_le32
from ppc_extproc.tokens.streaming import StreamingPrompt

SIZES = {"small": 0, "fast": 4096, "streamed": 70_000}


def parse(raw: bytes, size: str, path: str = "/v1/completions") -> ParsedBody:
    """``raw`` padded with trailing whitespace to the size class, parsed as the service would."""
    body = raw + b" " * max(0, SIZES[size] - len(raw))
    if size != "streamed":
        return parse_body(path, body)
    field = token_field_for_path(path)
    assert field is not None
    prompt = StreamingPrompt(field)
    prompt.feed(body[: len(body) - 1000])  # everything but the last chunk has arrived
    result = prompt.finish(body)
    return result[0] if result is not None else parse_body(path, body)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize(
    "raw",
    [
        b'{"model":"m","prompt":[1,2],"max_tokens":1000000000000000000000000}',  # beyond 64 bits
        b'{"model":"m","prompt":[1,2],"logit_bias":{"5":-100000000000000000000000}}',
        b'{"model":"m","prompt":[1,2],"seed":18446744073709551616}',
    ],
)
def test_integers_beyond_64_bits_in_fields_we_do_not_read_are_routed(raw: bytes, size: str) -> None:
    parsed = parse(raw, size)
    assert parsed.model == "m" and parsed.tokenized is not None
    assert parsed.tokenized.prompts == (tokens_to_le32([1, 2]),)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b'{"model":"m","prompt":[1,1000000000000000000000000]}', "prompt[1]: token id 1e+24 is outside [0, 2^32)"),
        (b'{"model":"m","prompt":[[1,2],"abc"]}', "prompt[1]: expected an array of token ids"),
        (b'{"model":"m","prompt":[[1,2],{"a":1}]}', "prompt[1]: expected an array of token ids"),
        (b'{"model":"m","prompt":[1],"x":' + b"[" * 1100 + b"]" * 1100 + b"}", "depth limit exceeded"),
        (b'{"model":"m","prompt":[1],"x":' + b'{"a":' * 1100 + b"1" + b"}" * 1100 + b"}", "depth limit exceeded"),
        (b'{"model":"m","prompt":[1],"x":NaN}', "error unmarshaling request body"),
        (b'{"model":"m","prompt":[1],"x":1e999}', "number is infinity"),
        (b'{"model":"m","prompt":[1],"x":"\\ud800"}', "no low surrogate"),
        (b'{"model":"m","prompt":[1],"x":"\xed\xa0\x80"}', "not valid UTF-8"),
        (b'\xef\xbb\xbf{"model":"m","prompt":[1]}', "byte order mark"),
        (b'{"model":"m","stream":"x","prompt":[1],"stream":1}', "stream: expected a boolean"),
    ],
)
def test_malformed_bodies_get_the_same_400_in_every_size_class(raw: bytes, message: str, size: str) -> None:
    with pytest.raises(BadRequestError) as info:
        parse(raw, size)
    assert message in info.value.message
    assert info.value.status == 400


@pytest.mark.parametrize("size", SIZES)
def test_duplicate_keys_resolve_as_vllm_does_last_wins(size: str) -> None:
    parsed = parse(b'{"model":"a","prompt":[1,2],"stream":"no","model":"b","prompt":[3,4],"stream":true}', size)
    assert (parsed.model, parsed.stream) == ("b", True)
    assert parsed.tokenized is not None and parsed.tokenized.prompts == (tokens_to_le32([3, 4]),)


@pytest.mark.parametrize("size", SIZES)
def test_a_long_prompt_duplicated_by_a_short_one_takes_the_short_one(size: str) -> None:
    long = b",".join(str(i).encode() for i in range(20_000))
    parsed = parse(b'{"model":"m","prompt":[' + long + b'],"prompt":[7]}', size)
    assert parsed.tokenized is not None and parsed.tokenized.prompts == (tokens_to_le32([7]),)
    parsed = parse(b'{"model":"m","prompt":[7],"prompt":[' + long + b"]}", size)
    assert parsed.tokenized is not None and parsed.tokenized.prompts == (tokens_to_le32(range(20_000)),)


@pytest.mark.parametrize("size", SIZES)
def test_several_faults_name_the_same_field_on_every_path(size: str) -> None:
    """features are validated before model on every path."""
    raw = b'{"model":5,"token_ids":[1,2],"features":{"mm_hashes":{"image":"x"}}}'
    with pytest.raises(BadRequestError) as info:
        parse(raw, size, "/inference/v1/generate")
    assert info.value.message == "features.mm_hashes.image: expected arrays"
