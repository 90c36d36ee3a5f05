"""``POST /tokenize`` as vLLM answers it (what vllm-router asks before each text request)."""

from __future__ import annotations

import pytest

from ppc_extproc_lab.mock_vllm.engine import EngineConfig, MockEngine, RequestRejected
from ppc_extproc_lab.mock_vllm.peer_probes import tokenize_body
from ppc_extproc_lab.mock_vllm.protocol import NotFound

ENGINE = MockEngine(EngineConfig(model="m", block_size=16, num_blocks=10))


def test_a_string_prompt_is_its_utf8_bytes() -> None:
    answer = tokenize_body({"model": "m", "prompt": "héllo"}, ENGINE)
    assert answer == {"count": 6, "max_model_len": 160, "tokens": list("héllo".encode()), "token_strs": None}
    assert tokenize_body({"prompt": ""}, ENGINE)["tokens"] == []
    assert tokenize_body({"prompt": "ab", "return_token_strs": True}, ENGINE)["token_strs"] == ["a", "b"]


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ({"model": "other", "prompt": "x"}, NotFound),
        ({"messages": [{"role": "user", "content": "x"}]}, RequestRejected),
        ({"prompt": [1, 2]}, RequestRejected),
        ([], RequestRejected),
    ],
)
def test_what_it_rejects(body: object, error: type[Exception]) -> None:
    with pytest.raises(error):
        tokenize_body(body, ENGINE)
