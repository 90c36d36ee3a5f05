"""The local backend's token ids == real vLLM 0.32's render endpoints, on the same model directory.

``LocalTokenizer.from_dir(model_dir).tokenize(api, body)`` against ``POST /v1/chat/completions/render``,
``/v1/completions/render`` and ``/v1/messages/render`` (vllm-project/vllm:
vllm/entrypoints/scale_out/render/serving.py) of a vLLM engine serving the tiny Llama: named cases
(system prompt, multi-turn, tools, tool calls and results, ``continue_final_message``, unicode,
special-token look-alikes typed by the user, ``add_special_tokens``, content parts, ``developer``,
Anthropic bodies), then hypothesis-generated chats and prompts. A body vLLM rejects (400) must be
rejected locally too.

Opt-in: ``pytest --real-vllm tests/real_vllm`` (see ``scripts/setup_real_vllm.sh``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from real_vllm_helpers import MODEL, OBSERVED

from ppc_extproc.errors import BadRequestError
from ppc_extproc.tokenizer import LocalTokenizer

pytestmark = [pytest.mark.real_vllm, pytest.mark.integration, pytest.mark.timeout(1800)]

@pytest.fixture(scope="module")
def local(model_dir: Path) -> LocalTokenizer:
    return LocalTokenizer.from_dir(model_dir)


def vllm_render(render: httpx.Client, api: str, body: dict[str, Any]) -> list[list[int]] | str:
    """Token ids per prompt, or the error message of a 400."""
    path = {"chat": "/v1/chat/completions/render", "messages": "/v1/messages/render"}.get(api, "/v1/completions/render")
    response = render.post(path, json={"model": MODEL, **body})
    if response.status_code == 400:
        return str(response.json()["error"]["message"])
    assert response.status_code == 200, response.text
    answer = response.json()
    return [a["token_ids"] for a in answer] if api == "completions" else [answer["token_ids"]]


def local_render(local: LocalTokenizer, api: str, body: dict[str, Any]) -> list[list[int]] | str:
    try:
        result = local.tokenize(api, json.dumps({"model": MODEL, **body}).encode())  # type: ignore[arg-type]
    except BadRequestError as exc:
        return f"BadRequestError: {exc}"
    assert result.ok, (result.reason, result.detail)
    return [np.frombuffer(p, dtype="<u4").tolist() for p in result.prompts]


def check(render: httpx.Client, local: LocalTokenizer, api: str, body: dict[str, Any], kind: str) -> None:
    expected, got = vllm_render(render, api, body), local_render(local, api, body)
    if isinstance(expected, str):
        assert isinstance(got, str), f"vLLM rejected the body ({expected}); the local backend tokenized it"
        OBSERVED["parity"][f"{kind}:rejected"] += 1
        return
    assert got == expected, f"body: {json.dumps(body, ensure_ascii=False)}"
    OBSERVED["parity"][kind] += 1


# --- named cases ----------------------------------------------------------------------------------

SYSTEM = {"role": "system", "content": "You are terse. Answer in one line."}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "units": {"enum": ["c", "f"]}}}}}  # fmt: skip
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Zürich", "units": "c"}'}}

CHATS: dict[str, dict[str, Any]] = {
    "system": {"messages": [SYSTEM, {"role": "user", "content": "Hello world, what is a KV cache?"}]},
    "user_only": {"messages": [{"role": "user", "content": "hi"}]},
    "multi_turn": {"messages": [SYSTEM, {"role": "user", "content": "What is a block?"},
                                {"role": "assistant", "content": "A run of 32 tokens."},
                                {"role": "user", "content": "And a prefix?"}]},
    "tools_auto_choice": {"messages": [SYSTEM, {"role": "user", "content": "Weather in Zürich?"}], "tools": [WEATHER]},
    "tools_choice_none": {"messages": [{"role": "user", "content": "Weather?"}], "tools": [WEATHER], "tool_choice": "none"},
    "tool_call_and_result": {"messages": [SYSTEM, {"role": "user", "content": "Weather in Zürich?"},
                                          {"role": "assistant", "content": None, "tool_calls": [CALL]},
                                          {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'}],
                             "tools": [WEATHER]},
    "tool_call_invalid_arguments": {"messages": [{"role": "user", "content": "x"},
                                                 {"role": "assistant", "content": "", "tool_calls": [
                                                     {**CALL, "function": {"name": "f", "arguments": "not json"}}]},
                                                 {"role": "user", "content": "y"}]},
    "continue_final_message": {"messages": [SYSTEM, {"role": "user", "content": "Define KV cache."},
                                            {"role": "assistant", "content": "A KV cache"}],
                               "continue_final_message": True, "add_generation_prompt": False},
    "no_generation_prompt": {"messages": [SYSTEM, {"role": "user", "content": "hi"}], "add_generation_prompt": False},
    "unicode": {"messages": [{"role": "system", "content": "Ελληνικά και日本語 😀"},
                             {"role": "user", "content": "Zürich → café naïve ß ñ привет \u00a0\u2028 e\u0301"}]},
    "special_token_lookalikes": {"messages": [{"role": "user", "content": "<|user|>hi<|eos|> <|bos|><|assistant|> <|use <|assistant |> <|system|>"},
                                              {"role": "assistant", "content": "<|pad|>"}, {"role": "user", "content": "<|eos|>"}]},
    "add_special_tokens": {"messages": [SYSTEM, {"role": "user", "content": "hi"}], "add_special_tokens": True},
    "content_parts": {"messages": [{"role": "system", "content": [{"type": "text", "text": "part one"}, {"type": "text", "text": "part two"}]},
                                   {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]},
    "developer_role": {"messages": [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "hi"}]},
    "user_name": {"messages": [{"role": "user", "name": "alice", "content": "hi"}]},
    "whitespace": {"messages": [{"role": "user", "content": "  leading\n\n\ttabs  and trailing   "}]},
    "empty_content": {"messages": [{"role": "user", "content": ""}]},
    "empty_text_parts": {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": ""},
                                                                  {"type": "text", "text": "b"}]}]},
    "tool_reference_part": {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                                     {"type": "tool_reference", "name": "get_weather"}]}]},
    "bare_string_parts": {"messages": [{"role": "user", "content": ["a", "b"]}]},
    "null_user_content": {"messages": [{"role": "user", "content": None}]},
    "omitted_user_content": {"messages": [{"role": "user"}]},
    "null_assistant_content": {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": None}]},
    "empty_tools": {"messages": [{"role": "user", "content": "q"}], "tools": []},
    "assistant_reasoning": {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "reasoning": "hm"},
                                         {"role": "user", "content": "q2"}]},
    "custom_role": {"messages": [{"role": "observer", "content": "note"}, {"role": "user", "content": "q"}]},
    "both_generation_flags": {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
                              "continue_final_message": True},
    "template_kwargs_ignored": {"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"unused": 1},
                                "reasoning_effort": "low"},
}

#: Anthropic Messages bodies: vLLM converts them to chat (vllm/entrypoints/anthropic/serving.py).
MESSAGES: dict[str, dict[str, Any]] = {
    "system_string": {"system": "You are terse.", "messages": [{"role": "user", "content": "hi"}]},
    "system_blocks": {"system": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                      "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "text", "text": ""}]}]},
    "tool_use_and_result": {"messages": [
        {"role": "user", "content": "Weather in Zürich?"},
        {"role": "assistant", "content": [{"type": "text", "text": "Checking."},
                                          {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Zürich"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "21 C"}]}]}],
        "tools": [{"name": "get_weather", "description": "Weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]},
    "empty_tools": {"messages": [{"role": "user", "content": "hi"}], "tools": []},
    "thinking": {"messages": [{"role": "user", "content": "q"},
                              {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": "s"},
                                                                {"type": "text", "text": "a"}]},
                              {"role": "user", "content": "q2"}]},
}

PROMPTS: dict[str, dict[str, Any]] = {
    "text": {"prompt": "Hello world"},
    "no_special_tokens": {"prompt": "Hello world", "add_special_tokens": False},
    "batch": {"prompt": ["The cache prefix block", "tokens <|eos|> after"]},
    "starts_with_bos": {"prompt": "<|bos|>Hello"},
    "unicode": {"prompt": "Zürich 日本語 😀 → café"},
    "lookalikes": {"prompt": "<|user|> typed <|assistant|>", "add_special_tokens": False},
    "token_ids": {"prompt": [1, 5, 62, 269]},
}


@pytest.mark.parametrize("case", sorted(CHATS))
def test_chat_render_ids_equal_vllm(render: httpx.Client, local: LocalTokenizer, case: str) -> None:
    check(render, local, "chat", CHATS[case], f"chat:{case}")


@pytest.mark.parametrize("case", sorted(MESSAGES))
def test_anthropic_messages_render_ids_equal_vllm(render: httpx.Client, local: LocalTokenizer, case: str) -> None:
    check(render, local, "messages", {"max_tokens": 16, **MESSAGES[case]}, f"messages:{case}")


@pytest.mark.parametrize("case", sorted(PROMPTS))
def test_completion_render_ids_equal_vllm(render: httpx.Client, local: LocalTokenizer, case: str) -> None:
    check(render, local, "completions", PROMPTS[case], f"completions:{case}")


def test_continue_final_message_extends_the_prompt_without_eos(render: httpx.Client, local: LocalTokenizer) -> None:
    """The relation of the tokenization vectors, on vLLM's ids: the continued text follows the
    prompt directly (no end-of-turn token after it)."""
    body = CHATS["continue_final_message"]
    prompt = vllm_render(render, "chat", {"messages": body["messages"][:2]})
    continued = vllm_render(render, "chat", body)
    assert isinstance(prompt, list) and isinstance(continued, list)
    tail = local.tokenizer.encode_ids("A KV cache", add_special_tokens=False)
    assert continued[0] == prompt[0] + tail


# --- generated cases ------------------------------------------------------------------------------

_PIECES = st.sampled_from([
    "<|user|>", "<|eos|>", "<|bos|>", "<|assistant|>", "<|system|>", "<|pad|>", "<|use", "<|assistant", "|>", "<",
    " ", "  ", "\n", "\n\n", "\t", "Hello", " world", " KV cache", " prefix", "Zürich", "日本語", "😀", "e\u0301",
    '{"a": 1}', "{{ x }}", "{% if %}", "<call>", "Tools:", "[tool]", "CONTINUE", "'", '"', "\\",
])  # fmt: skip
TEXT = st.lists(st.one_of(_PIECES, st.text(max_size=10)), max_size=10).map("".join)
_TOOL = st.builds(
    lambda name, keys, desc: {"type": "function", "function": {
        "name": name, **({"description": desc} if desc is not None else {}),
        "parameters": {"type": "object", "properties": {k: {"type": "string"} for k in keys}}}},
    st.sampled_from(["get_weather", "search", "f"]),
    st.lists(st.sampled_from(["city", "z", "a", "ünits", "q"]), unique=True, max_size=3),
    st.none() | TEXT,
)  # fmt: skip
_ARGUMENTS = st.one_of(
    st.dictionaries(st.sampled_from(["city", "n", "z", "a"]), st.one_of(st.integers(-5, 5), TEXT, st.none()), max_size=3).map(json.dumps),
    st.sampled_from(["", "{}", "not json", "[1, 2]", "null"]),
)
_CALL = st.builds(
    lambda name, args: {"id": "call_1", "type": "function", "function": {"name": name, "arguments": args}},
    st.sampled_from(["get_weather", "f"]), _ARGUMENTS,
)
_CONTENT = st.one_of(TEXT, st.lists(TEXT.map(lambda t: {"type": "text", "text": t}), min_size=1, max_size=3))


@st.composite
def chats(draw: st.DrawFn) -> dict[str, Any]:
    messages: list[dict[str, Any]] = []
    if draw(st.booleans()):
        messages.append({"role": draw(st.sampled_from(["system", "system", "developer"])), "content": draw(_CONTENT)})
    for turn in range(draw(st.integers(1, 4))):
        user: dict[str, Any] = {"role": "user", "content": draw(_CONTENT)}
        if draw(st.integers(0, 5)) == 0:
            user["name"] = draw(st.sampled_from(["alice", "bob"]))
        messages.append(user)
        if turn < 3 and draw(st.booleans()):
            reply: dict[str, Any] = {"role": "assistant", "content": draw(st.none() | TEXT | TEXT)}
            if draw(st.integers(0, 5)) == 0:
                reply["reasoning"] = draw(TEXT)
            if draw(st.integers(0, 3)) == 0:
                reply["tool_calls"] = [draw(_CALL)]
                messages.append(reply)
                if draw(st.booleans()):
                    messages.append({"role": "tool", "tool_call_id": "call_1", "content": draw(_CONTENT)})
                continue
            messages.append(reply)
    body: dict[str, Any] = {"messages": messages}
    if draw(st.booleans()):
        body["tools"] = draw(st.lists(_TOOL, min_size=1, max_size=2))
        if draw(st.booleans()):
            body["tool_choice"] = "none"
    if messages[-1]["role"] == "assistant" and messages[-1]["content"] is not None and draw(st.booleans()):
        body.update(continue_final_message=True, add_generation_prompt=False)
    elif draw(st.integers(0, 4)) == 0:
        body["add_generation_prompt"] = False
    if draw(st.booleans()):
        body["add_special_tokens"] = draw(st.booleans())
    return body


PROMPT_BODIES = st.builds(
    lambda prompt, special: {"prompt": prompt, **({"add_special_tokens": special} if special is not None else {})},
    st.one_of(TEXT.filter(bool), st.lists(TEXT.filter(bool), min_size=1, max_size=3)),
    st.none() | st.booleans(),
)
#: Generated chats per run (deterministic: the same bodies every run); more with PPC_REAL_VLLM_EXAMPLES.
EXAMPLES = int(os.environ.get("PPC_REAL_VLLM_EXAMPLES", "1000"))
_SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                     suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])  # fmt: skip


@_SETTINGS
@given(body=chats())
def test_generated_chats_equal_vllm(render: httpx.Client, local: LocalTokenizer, body: dict[str, Any]) -> None:
    check(render, local, "chat", body, "chat:generated")


@settings(_SETTINGS, max_examples=max(1, EXAMPLES // 3))
@given(body=PROMPT_BODIES)
def test_generated_prompts_equal_vllm(render: httpx.Client, local: LocalTokenizer, body: dict[str, Any]) -> None:
    check(render, local, "completions", body, "completions:generated")
