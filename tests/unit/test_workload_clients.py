"""Request forms: what each client puts on the wire, asks the oracle, and falls back to; which
form each router is sent."""

from __future__ import annotations

import pytest

from ppc_extproc.mock_vllm.request import output_tokens
from ppc_extproc.workload.clients import ChatClient, CompletionsClient, client_for, mock_text_answer
from ppc_extproc.workload.policies import policy
from ppc_extproc.workload.text import TextPrompt

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
