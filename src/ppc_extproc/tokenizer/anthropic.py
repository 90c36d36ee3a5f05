"""Anthropic Messages bodies → the chat body vLLM renders for them, as vLLM 0.32's
``AnthropicServingMessages.to_chat_completion_request`` builds it
(``vllm/entrypoints/anthropic/serving.py``)."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

from ppc_extproc.errors import BadRequestError

__all__ = ["anthropic_to_chat", "has_inline_system"]

_BILLING_HEADER = "x-anthropic-billing-header"


def _image_url(source: Mapping[str, Any]) -> str:
    if source.get("type") == "url":
        return str(source.get("url", ""))
    return f"data:{source.get('media_type', 'image/jpeg')};base64,{source.get('data', '')}"


def _system_text(content: Any) -> str | None:
    if isinstance(content, str):
        return None if content.startswith(_BILLING_HEADER) else content
    parts = [
        b["text"]
        for b in content
        if b.get("type") == "text" and b.get("text") and not str(b["text"]).startswith(_BILLING_HEADER)
    ]
    return "".join(parts) if parts else None


def _check_anthropic(obj: Mapping[str, Any]) -> list[dict[str, Any]]:
    messages = obj.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequestError("messages: messages must contain at least one item")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant", "system"):
            raise BadRequestError(f"messages[{i}].role: expected 'user', 'assistant' or 'system'")
        c = m.get("content")
        if isinstance(c, list):
            if not c:
                raise BadRequestError(f"messages[{i}].content: message content must not be empty")
            for j, b in enumerate(c):
                if not isinstance(b, dict) or not isinstance(b.get("type"), str):
                    raise BadRequestError(f"messages[{i}].content[{j}].type: expected a string")
        elif not isinstance(c, str):
            raise BadRequestError(f"messages[{i}].content: expected a string or an array of content blocks")
    system = obj.get("system")
    if system is not None and not isinstance(system, (str, list)):
        raise BadRequestError("system: expected a string or an array of text blocks")
    if isinstance(system, list) and not all(isinstance(b, dict) for b in system):
        raise BadRequestError("system: expected an array of text blocks")
    return messages


def _tool_result_text(block: Mapping[str, Any]) -> tuple[str, list[str], list[dict[str, Any]]]:
    content = block.get("content")
    if isinstance(content, str):
        return content, [], []
    texts: list[str] = []
    images: list[str] = []
    refs: list[dict[str, Any]] = []
    if isinstance(content, list):
        for item in content:
            if not isinstance(item, dict):
                continue
            kind = item.get("type")
            if kind == "text":
                texts.append(str(item.get("text", "")))
            elif kind == "image":
                url = _image_url(item.get("source") or {})
                if url:
                    images.append(url)
            elif kind == "tool_reference":
                name = item.get("tool_name") or item.get("name")
                if name:
                    refs.append({"type": "tool_reference", "name": name})
    return "\n".join(texts), images, refs


def _convert_message(m: Mapping[str, Any], out: list[dict[str, Any]]) -> None:
    role = m["role"]
    msg: dict[str, Any] = {"role": role}
    content = m["content"]
    if isinstance(content, str):
        msg["content"] = content
    else:
        parts: list[dict[str, Any]] = []
        calls: list[dict[str, Any]] = []
        reasoning: list[str] = []
        for b in content:
            kind = b["type"]
            if kind == "text" and b.get("text"):
                parts.append({"type": "text", "text": b["text"]})
            elif kind == "image" and b.get("source"):
                parts.append({"type": "image_url", "image_url": {"url": _image_url(b["source"])}})
            elif kind == "thinking" and b.get("thinking") is not None:
                reasoning.append(str(b["thinking"]))
            elif kind == "tool_use":
                calls.append(
                    {
                        "id": b.get("id") or f"call_{int(time.time())}",
                        "type": "function",
                        "function": {"name": b.get("name") or "", "arguments": json.dumps(b.get("input") or {})},
                    }
                )
            elif kind == "tool_result":
                if role == "user":
                    text, images, refs = _tool_result_text(b)
                    tool_id = b.get("tool_use_id") or ""
                    out.append({"role": "tool", "tool_call_id": tool_id, "content": text or ""})
                    if images:
                        out.append({"role": "user", "content": [{"type": "image_url", "image_url": {"url": u}} for u in images]})
                    if refs:
                        out.append({"role": "tool", "tool_call_id": tool_id, "content": refs})
                else:
                    c = b.get("content")
                    parts.append({"type": "text", "text": f"Tool result: {c if c else ''}"})
        if reasoning:
            msg["reasoning"] = "".join(reasoning)
        if calls:
            msg["tool_calls"] = calls
        if parts:
            msg["content"] = parts[0]["text"] if len(parts) == 1 and parts[0]["type"] == "text" else parts
    if not (role == "user" and "content" not in msg):
        out.append(msg)


def anthropic_to_chat(
    obj: Mapping[str, Any], *, merge_inline_system: bool, disabled_thinking_effort: str = "none"
) -> dict[str, Any]:
    """An Anthropic Messages body as the chat body vLLM renders for it.

    ``merge_inline_system`` is vLLM's template probe (``_detect_merge_inline_system``: true when
    the template rejects a non-leading system message); ``disabled_thinking_effort`` is what
    ``thinking: {"type": "disabled"}`` maps to (``none``, or ``low`` when the template ignores
    ``none``). ``tool_addition``/``tool_removal`` blocks are not supported (400).
    """
    messages = _check_anthropic(obj)
    out: list[dict[str, Any]] = []
    system_parts: list[str] = []
    system = obj.get("system")
    if system:
        if isinstance(system, str):
            system_parts.append(system)
        else:
            for b in system:
                if b.get("type") == "text" and b.get("text") and not str(b["text"]).startswith(_BILLING_HEADER):
                    system_parts.append(str(b["text"]))
    if merge_inline_system:
        for m in messages:
            if m["role"] == "system" and (text := _system_text(m["content"])):
                system_parts.append(text)
    if system_parts:
        out.append({"role": "system", "content": "".join(system_parts)})
    for m in messages:
        if isinstance(m["content"], list) and any(b["type"] in ("tool_addition", "tool_removal") for b in m["content"]):
            raise BadRequestError("messages: tool_addition/tool_removal blocks are not supported by the local tokenizer")
        if m["role"] == "system":
            if not merge_inline_system and (text := _system_text(m["content"])):
                out.append({"role": "system", "content": text})
            continue
        _convert_message(m, out)
    chat: dict[str, Any] = {"model": obj.get("model"), "messages": out}
    for key in ("cache_salt", "chat_template_kwargs"):
        if obj.get(key) is not None:
            chat[key] = obj[key]
    output_config = obj.get("output_config")
    if isinstance(output_config, dict) and output_config.get("effort") is not None:
        chat["reasoning_effort"] = output_config["effort"]
    thinking = obj.get("thinking")
    if isinstance(thinking, dict) and thinking.get("type") == "disabled":
        chat["reasoning_effort"] = disabled_thinking_effort
    tools = obj.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise BadRequestError("tools: expected an array")
        converted = []
        for i, t in enumerate(tools):
            if not isinstance(t, dict) or not isinstance(t.get("name"), str):
                raise BadRequestError(f"tools[{i}].name: expected a string")
            converted.append(
                {
                    "type": "function",
                    "function": {
                        "name": t["name"],
                        "description": t.get("description"),
                        "parameters": t.get("input_schema"),
                        "strict": t.get("strict"),
                        "defer_loading": t.get("defer_loading"),
                    },
                }
            )
        chat["tools"] = converted
    return chat


def has_inline_system(obj: Mapping[str, Any]) -> bool:
    """Whether an Anthropic body has ``role: system`` messages."""
    msgs = obj.get("messages")
    return isinstance(msgs, Sequence) and any(isinstance(m, dict) and m.get("role") == "system" for m in msgs)
