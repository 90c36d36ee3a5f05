"""vLLM 0.32's message parsing and validation where the local backend differed: cases the
real-vLLM parity test (``tests/real_vllm/``) found, reproduced here without vLLM.

``vllm/renderers/chat_utils.py`` ``_parse_chat_message_content_parts`` parses each part of a
``string``-format message to a string (a ``tool_reference`` to its ``name``) and keeps only the
truthy ones before joining with ``"\\n"``. ``ChatCompletionRequest`` validation
(``vllm/entrypoints/openai/chat_completion/protocol.py``) refuses bare strings inside a content
array, ``content: null`` outside assistant messages and ``tools: []``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from ppc_extproc.errors import BadRequestError
from ppc_extproc.tokenizer import LocalTokenizer
from ppc_extproc.tokenizer.local import template_messages


def text(t: str) -> dict[str, str]:
    return {"type": "text", "text": t}


def chat_ids(local: LocalTokenizer, messages: list[dict[str, Any]]) -> list[int]:
    res = local.tokenize("chat", {"model": "tiny", "messages": messages})
    assert res.ok
    return np.frombuffer(res.prompts[0], dtype="<u4").tolist()


def test_empty_text_parts_add_no_separator(local: LocalTokenizer) -> None:
    parts = [text("a"), text(""), text("b"), text("")]
    assert template_messages(({"role": "user", "content": parts},), "string") == [{"role": "user", "content": "a\nb"}]
    assert chat_ids(local, [{"role": "user", "content": parts}]) == chat_ids(local, [{"role": "user", "content": "a\nb"}])
    only_empty = [{"role": "user", "content": [text(""), text("")]}]
    assert chat_ids(local, only_empty) == chat_ids(local, [{"role": "user", "content": ""}])


def test_empty_text_parts_of_a_tool_result_add_no_separator(local: LocalTokenizer) -> None:
    tool = {"role": "tool", "tool_call_id": "c", "content": [text("a"), text("")]}
    assert template_messages((tool,), "string")[0]["content"] == "a"


def test_a_tool_reference_part_is_its_name_in_string_content(local: LocalTokenizer) -> None:
    parts = [text("a"), {"type": "tool_reference", "name": "get_weather"}, {"type": "tool_reference", "name": ""}]
    assert template_messages(({"role": "user", "content": parts},), "string")[0]["content"] == "a\nget_weather"
    assert chat_ids(local, [{"role": "user", "content": parts}]) == chat_ids(local, [{"role": "user", "content": "a\nget_weather"}])


def test_openai_format_keeps_empty_text_parts() -> None:
    parts = [text("a"), text("")]
    assert template_messages(({"role": "user", "content": parts},), "openai")[0]["content"] == parts


def test_bare_strings_in_a_content_array_are_refused(local: LocalTokenizer) -> None:
    with pytest.raises(BadRequestError, match=r"messages\[0\]\.content\[0\]: expected an object"):
        local.tokenize("chat", {"messages": [{"role": "user", "content": ["", "a"]}]})


@pytest.mark.parametrize("role", ["user", "system", "developer", "tool", "custom"])
def test_null_content_is_refused_except_for_assistant_messages(local: LocalTokenizer, role: str) -> None:
    with pytest.raises(BadRequestError, match=r"messages\[0\]\.content"):
        local.tokenize("chat", {"messages": [{"role": role, "content": None}]})
    assert local.tokenize("chat", {"messages": [{"role": role}]}).ok  # omitted content is fine
    assert local.tokenize("chat", {"messages": [{"role": "assistant", "content": None}]}).ok


def test_an_empty_tools_array_is_refused_in_chat_bodies_only(local: LocalTokenizer) -> None:
    with pytest.raises(BadRequestError, match="tools: `tools` must not be an empty array"):
        local.tokenize("chat", {"messages": [{"role": "user", "content": "hi"}], "tools": []})
    anthropic = {"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], "tools": []}
    assert local.tokenize("messages", anthropic).ok
