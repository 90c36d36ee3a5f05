"""Request forms: what each client puts on the wire, asks the oracle, and falls back to; which
form each router is sent."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ppc_extproc.tokenizer import LocalTokenizer
from ppc_extproc_lab.mock_vllm.request import output_tokens
from ppc_extproc_lab.tiny_tokenizer import build_tiny_tokenizer
from ppc_extproc_lab.workload.clients import ChatClient, CompletionsClient, EngineTokens, client_for, mock_text_answer
from ppc_extproc_lab.workload.policies import policy
from ppc_extproc_lab.workload.text import TextPrompt, chars_per_token

PROMPT = TextPrompt(0, "context ", (("q1 ", "a1 "),), "q2")


def test_completion_forms_carry_the_same_prompt() -> None:
    assert CompletionsClient("text", model="m", max_tokens=4).match_body(PROMPT) == {"prompt": "context q1 a1 q2"}
    assert CompletionsClient("tokens", model="m", max_tokens=4).match_body(PROMPT) == {"prompt": list(b"context q1 a1 q2")}
    assert CompletionsClient("token-ids", model="m", max_tokens=4).match_body([5, 6]) == {"prompt": [5, 6]}
    assert CompletionsClient("text", model="m", max_tokens=4).prompt_tokens(PROMPT) == len(PROMPT.text)
    with pytest.raises(ValueError):
        CompletionsClient("chat", model="m", max_tokens=4)


def test_chat_asks_the_engine_to_match_the_messages() -> None:
    chat = ChatClient(model="m", max_tokens=4)
    assert chat.match_body(PROMPT) == {"messages": PROMPT.messages()}
    assert chat.form == "chat" and client_for("chat", model="m", max_tokens=4).form == "chat"
    with pytest.raises(ValueError, match="unknown request form"):
        client_for("nope", model="m", max_tokens=4)  # type: ignore[arg-type]


def test_fallback_is_the_mock_engines_answer() -> None:
    ids = output_tokens(PROMPT.token_ids(), 4, 0)
    assert mock_text_answer(PROMPT, 4) == bytes(ids).decode("ascii")
    assert CompletionsClient("text", model="m", max_tokens=4).fallback(PROMPT) == bytes(ids).decode("ascii")
    assert CompletionsClient("token-ids", model="m", max_tokens=4).fallback([1, 2]) == output_tokens([1, 2], 4, 0)


@pytest.mark.parametrize(
    ("name", "form", "reads_text", "sent"),
    [
        ("precise+load", "text", False, "tokens"),  # the service does not tokenise text (yet)
        ("precise+load", "text", True, "text"),
        ("precise+load", "chat", False, "chat"),
        ("approximate", "tokens", False, "tokens"),
        ("sglang-router", "tokens", False, "text"),  # 422 on token ids
        ("sglang-router", "chat", False, "chat"),
        ("vllm-router", "tokens", False, "tokens"),
        ("vllm-router", "text", False, "text"),
        ("oracle", "text", False, "text"),
    ],
)
def test_wire_form_per_router(name: str, form: str, reads_text: bool, sent: str) -> None:
    assert policy(name).wire_form(form, service_reads_text=reads_text) == sent  # type: ignore[arg-type]


def test_engine_tokens_without_a_tokenizer_are_utf8_bytes() -> None:
    tokens = EngineTokens()
    assert tokens.text("hé") == list("hé".encode())
    assert chars_per_token(tokens.text) == 1.0
    with pytest.raises(ValueError, match="tokenizer"):
        tokens.chat(PROMPT.messages())


def test_engine_tokens_with_a_tokenizer_follow_it(tmp_path: Path) -> None:
    tok = LocalTokenizer.from_dir(build_tiny_tokenizer(tmp_path))
    tokens = EngineTokens(tok)
    ids = tokens.text(PROMPT.text)
    assert ids[0] == 1 and ids == np.frombuffer(tok.encode(PROMPT.text, add_special_tokens=True), "<u4").tolist()
    chat = tokens.chat(PROMPT.messages())
    assert chat[0] == 1 and 5 in chat  # BOS, then the <|system|> marker of the template
    assert 1.5 < chars_per_token(tokens.text) < 10
    client = CompletionsClient("tokens", model="m", max_tokens=4, tokens=tokens)
    assert client.match_body(PROMPT) == {"prompt": ids}
    assert client.fallback(PROMPT) == bytes(output_tokens(ids, 4, 0)).decode("ascii")
    assert ChatClient(model="m", max_tokens=4, tokens=tokens).fallback(PROMPT) == bytes(output_tokens(chat, 4, 0)).decode()
