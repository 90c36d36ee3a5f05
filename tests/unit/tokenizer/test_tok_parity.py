"""LocalTokenizer == transformers 5.19 ``apply_chat_template(tokenize=False)`` + encode (vLLM 0.32's path).

Relations T1–T3 and T6 of the tokenization vectors, re-derived for the tiny tokenizer, then
hypothesis-generated chats: system prompts, multi-turn, tools, tool calls,
``continue_final_message``, unicode and special-token look-alikes typed by the user.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ppc_extproc.errors import BadRequestError
from ppc_extproc.tokenizer import LocalTokenizer

BOS, EOS, USER, ASSISTANT, SYSTEM = 1, 2, 3, 4, 5
T1_MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Hello world, what is a KV cache?"},
]


def ids(b: bytes) -> list[int]:
    return np.frombuffer(b, dtype="<u4").tolist()


def local_chat(local: LocalTokenizer, body: dict[str, Any]) -> list[int]:
    res = local.tokenize("chat", {"model": "tiny", **body})
    assert res.ok and len(res.prompts) == 1
    return ids(res.prompts[0])


def reference(hf: Any, messages: list[dict[str, Any]], *, tools: Any = None, agp: bool = True, cfm: bool = False, special: bool = False) -> list[int]:
    text = hf.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=agp, continue_final_message=cfm)
    return list(hf(text, add_special_tokens=special)["input_ids"])


def test_t1_chat_render(local: LocalTokenizer, hf_tok: Any) -> None:
    got = local_chat(local, {"messages": T1_MESSAGES, "max_tokens": 4})
    assert got == reference(hf_tok, T1_MESSAGES)
    assert got[:2] == [BOS, SYSTEM] and got[-2:] == [EOS, ASSISTANT]
    assert got.count(BOS) == 1


def test_t2_add_special_tokens_gives_two_bos(local: LocalTokenizer, hf_tok: Any) -> None:
    t1 = local_chat(local, {"messages": T1_MESSAGES})
    got = local_chat(local, {"messages": T1_MESSAGES, "add_special_tokens": True})
    assert got == [BOS, *t1] == reference(hf_tok, T1_MESSAGES, special=True)


def test_t3_completions(local: LocalTokenizer, hf_tok: Any) -> None:
    with_bos = ids(local.tokenize("completions", {"model": "tiny", "prompt": "Hello world"}).prompts[0])
    without = ids(local.tokenize("completions", {"prompt": "Hello world", "add_special_tokens": False}).prompts[0])
    assert with_bos == [BOS, *without] == list(hf_tok("Hello world")["input_ids"])
    batch = local.tokenize("completions", {"prompt": ["Hello world", "<|bos|>Hello"]})
    assert [ids(p) for p in batch.prompts] == [with_bos, [BOS, *list(hf_tok("<|bos|>Hello", add_special_tokens=False)["input_ids"])]]
    assert ids(local.tokenize("completions", {"prompt": [[5, 6, 7], [8]]}).prompts[1]) == [8]


def test_t6_continue_final_message(local: LocalTokenizer, hf_tok: Any) -> None:
    t1 = local_chat(local, {"messages": T1_MESSAGES})
    messages = [*T1_MESSAGES, {"role": "assistant", "content": "A KV cache"}]
    got = local_chat(local, {"messages": messages, "continue_final_message": True, "add_generation_prompt": False})
    assert got == reference(hf_tok, messages, agp=False, cfm=True)
    assert got == t1 + list(hf_tok("A KV cache", add_special_tokens=False)["input_ids"])
    assert got[-1] != EOS


def test_tools_reach_the_ids_in_wire_key_order(local: LocalTokenizer, hf_tok: Any) -> None:
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"z": {}, "a": {}}}}}
    dumped = {"type": "function", "function": {"name": "get_weather", "description": None, "parameters": tool["function"]["parameters"]}}
    got = local_chat(local, {"messages": T1_MESSAGES, "tools": [tool]})
    assert got == reference(hf_tok, T1_MESSAGES, tools=[dumped])
    sorted_tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"properties": {"a": {}, "z": {}}, "type": "object"}}}
    assert local_chat(local, {"messages": T1_MESSAGES, "tools": [sorted_tool]}) != got


def test_tool_call_arguments_are_decoded(local: LocalTokenizer, hf_tok: Any) -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"city": "Zürich", "n": 5}'}}
    msgs = [{"role": "user", "content": "x"}, {"role": "assistant", "content": None, "tool_calls": [call]}, {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    expected_msgs = [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": "", "tool_calls": [{**call, "function": {"name": "f", "arguments": {"city": "Zürich", "n": 5}}}]},
        {"role": "tool", "content": "a\nb", "tool_call_id": "c1"},
    ]
    assert local_chat(local, {"messages": msgs}) == reference(hf_tok, expected_msgs)


def test_malformed_bodies_name_the_field(local: LocalTokenizer) -> None:
    cases = {
        "messages": {"model": "m"},
        "messages[1].role": {"messages": [{"role": "user", "content": "a"}, {"content": "b"}]},
        "messages[0].content[0].type": {"messages": [{"role": "user", "content": [{"type": "bogus"}]}]},
        "tools[0].function": {"messages": T1_MESSAGES, "tools": [{"type": "function"}]},
        "cache_salt": {"messages": T1_MESSAGES, "cache_salt": "a/b"},
        "continue_final_message": {"messages": T1_MESSAGES, "continue_final_message": True},
        "chat_template_kwargs": {"messages": T1_MESSAGES, "chat_template_kwargs": "x"},
    }
    for field, body in cases.items():
        with pytest.raises(BadRequestError) as err:
            local.tokenize("chat", body)
        assert err.value.message.startswith(field), (field, err.value.message)
    with pytest.raises(BadRequestError, match="^prompt"):
        local.tokenize("completions", {"prompt": [1, "a"]})
    with pytest.raises(BadRequestError, match="error unmarshaling"):
        local.tokenize("chat", b"{not json")


def test_what_only_the_template_refuses_is_a_reason_not_a_400(local: LocalTokenizer) -> None:
    """vLLM may refuse these too, but the router routes them by load and lets the engine answer."""
    untrusted = local.tokenize("chat", {"messages": T1_MESSAGES, "chat_template": "{{ 1 }}"})
    assert untrusted.reason == "untrusted_chat_template" and "--trust-request-chat-template" in untrusted.detail
    bad_kwarg = local.tokenize("chat", {"messages": T1_MESSAGES, "chat_template_kwargs": {"tokenize": True}})
    assert bad_kwarg.reason == "template_error" and bad_kwarg.detail.startswith("chat_template_kwargs")


def test_multimodal_and_responses_are_reported_not_tokenized(local: LocalTokenizer) -> None:
    mm = {"messages": [{"role": "user", "content": [{"type": "text", "text": "see"}, {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}], "cache_salt": "s"}
    res = local.tokenize("chat", mm)
    assert res.reason == "multimodal_needs_render" and res.cache_salt == "s" and not res.prompts
    assert local.tokenize("responses", {"input": "hi"}).reason == "unsupported_body"


def test_cache_salt_is_returned_and_does_not_change_ids(local: LocalTokenizer) -> None:
    a = local.tokenize("chat", {"messages": T1_MESSAGES, "cache_salt": "s3cr3t"})
    assert a.cache_salt == "s3cr3t" and a.prompts == local.tokenize("chat", {"messages": T1_MESSAGES}).prompts


def test_anthropic_messages_follow_vllm_conversion(local: LocalTokenizer, hf_tok: Any) -> None:
    body = {
        "model": "tiny", "max_tokens": 8,
        "system": [{"type": "text", "text": "x-anthropic-billing-header: cch=123"}, {"type": "text", "text": "Be brief."}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "weather?"}]},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm"}, {"type": "tool_use", "id": "t1", "name": "w", "input": {"city": "Zürich"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "sunny"}]}, {"type": "text", "text": "thanks"}]},
            {"role": "system", "content": "inline note"},
        ],
        "tools": [{"name": "w", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
    }
    chat = local.anthropic_chat_body(body)
    assert [m["role"] for m in chat["messages"]] == ["system", "user", "assistant", "tool", "user", "system"]
    assert chat["messages"][0]["content"] == "Be brief."
    assert chat["messages"][2]["tool_calls"][0]["function"]["arguments"] == '{"city": "Z\\u00fcrich"}'
    res = local.tokenize("messages", body)
    tools = [{"type": "function", "function": {"name": "w", "description": None, "parameters": body["tools"][0]["input_schema"]}}]
    msgs = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "t1", "type": "function", "function": {"name": "w", "arguments": {"city": "Zürich"}}}], "reasoning": "hmm", "reasoning_content": "hmm"},
        {"role": "tool", "content": "sunny", "tool_call_id": "t1"},
        {"role": "user", "content": "thanks"},
        {"role": "system", "content": "inline note"},
    ]
    assert ids(res.prompts[0]) == reference(hf_tok, msgs, tools=tools)


def test_inline_system_is_merged_when_the_template_rejects_it(tiny_dir: Any) -> None:
    strict = LocalTokenizer.from_dir(tiny_dir)
    guard = "{% for m in messages %}{% if m.role == 'system' and not loop.first %}{{ raise_exception('System message must be at the beginning.') }}{% endif %}{{ m.content }}{% endfor %}"
    from ppc_extproc.tokenizer.chat_template import ChatTemplates

    strict.templates = ChatTemplates(guard)
    body = {"system": "A", "messages": [{"role": "user", "content": "u"}, {"role": "system", "content": "B"}]}
    assert strict.anthropic_chat_body(body)["messages"] == [{"role": "system", "content": "AB"}, {"role": "user", "content": "u"}]
    refused = strict.tokenize("chat", {"messages": [{"role": "user", "content": "u"}, {"role": "system", "content": "B"}]})
    assert refused.reason == "template_error" and "System message must be at the beginning" in refused.detail


# --- hypothesis: random chats ---------------------------------------------------------------------

_TEXT = st.lists(
    st.one_of(
        st.sampled_from(["<|user|>", "<|eos|>", "<|bos|>", "<|use", "<|assistant", "|>", "<", " ", "\n", "Hello", " KV cache", "Zürich", "日本語", "😀", "{\"a\": 1}", "{{ x }}", "{% if %}"]),
        st.text(max_size=12),
    ),
    max_size=12,
).map("".join)
_TOOL = st.builds(
    lambda name, keys: {"type": "function", "function": {"name": name, "description": None, "parameters": {"type": "object", "properties": {k: {"type": "string"} for k in keys}}}},
    st.sampled_from(["get_weather", "search", "f"]),
    st.lists(st.sampled_from(["city", "z", "a", "ünits", "q"]), unique=True, max_size=3),
)
_CALL = st.builds(
    lambda name, args: {"id": "call_1", "type": "function", "function": {"name": name, "arguments": args}},
    st.sampled_from(["get_weather", "f"]),
    st.dictionaries(st.sampled_from(["city", "n", "z", "a"]), st.one_of(st.integers(-5, 5), _TEXT), max_size=3),
)


@st.composite
def chats(draw: st.DrawFn) -> dict[str, Any]:
    messages: list[dict[str, Any]] = []
    if draw(st.booleans()):
        messages.append({"role": "system", "content": draw(_TEXT)})
    for i in range(draw(st.integers(1, 4))):
        messages.append({"role": "user", "content": draw(_TEXT)})
        if i < 3 and draw(st.booleans()):
            msg: dict[str, Any] = {"role": "assistant", "content": draw(_TEXT)}
            if draw(st.integers(0, 3)) == 0:
                msg["tool_calls"] = [draw(_CALL)]
            messages.append(msg)
    cfm = messages[-1]["role"] == "assistant" and draw(st.booleans()) and messages[-1]["content"].strip() != ""
    tools = draw(st.one_of(st.none(), st.lists(_TOOL, min_size=1, max_size=2)))
    return {"messages": messages, "tools": tools, "cfm": cfm, "special": draw(st.booleans())}


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(chat=chats())
def test_random_chats_match_transformers(local: LocalTokenizer, hf_tok: Any, chat: dict[str, Any]) -> None:
    body: dict[str, Any] = {"messages": chat["messages"], "add_special_tokens": chat["special"]}
    if chat["tools"] is not None:
        body["tools"] = chat["tools"]
    if chat["cfm"]:
        body.update(continue_final_message=True, add_generation_prompt=False)
    try:
        expected = reference(hf_tok, chat["messages"], tools=chat["tools"], agp=not chat["cfm"], cfm=chat["cfm"], special=chat["special"])
    except ValueError:  # transformers refuses (e.g. the final message vanished): no ids from us either
        assert local.tokenize("chat", {"model": "tiny", **body}).reason == "template_error"
        return
    assert local_chat(local, body) == expected
