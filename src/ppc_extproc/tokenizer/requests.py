"""Request bodies → typed render inputs, with 400s that name the field.

Shapes and defaults are vLLM 0.32's (``vllm/entrypoints/openai/chat_completion/protocol.py``,
``…/completion/protocol.py``, ``vllm/entrypoints/generate/base/protocol.py``):

* completions: ``prompt`` is a string, a list of strings, a list of token ids or a list of lists;
  ``add_special_tokens`` defaults to true;
* chat completions: ``messages`` (text content parts; any other part marks the request
  multimodal), ``tools`` dumped as ``ChatCompletionToolsParam.model_dump()``, ``documents``,
  ``chat_template``, ``chat_template_kwargs``, ``add_generation_prompt`` (true),
  ``continue_final_message`` (false), ``add_special_tokens`` (false), ``reasoning_effort``,
  ``cache_salt`` (``validate_cache_salt``);
* Anthropic messages: converted to chat as vLLM's ``AnthropicServingMessages.to_chat_completion_request``
  does (``vllm/entrypoints/anthropic/serving.py``), see ``ppc_extproc.tokenizer.anthropic``.

The Responses API is not rendered locally (its conversion depends on server state and harmony);
callers report it as unsupported.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ppc_extproc.errors import BadRequestError

# anthropic_to_chat and has_inline_system are re-exported from their own module.
from ppc_extproc.tokenizer.anthropic import anthropic_to_chat, has_inline_system
from ppc_extproc.tokens.paths import Api, api_for_path

__all__ = [
    "Api",
    "ChatInput",
    "CompletionInput",
    "anthropic_to_chat",
    "api_for_path",
    "has_inline_system",
    "parse_chat",
    "parse_completion",
    "validate_cache_salt",
]


#: Content part types vLLM parses as text, and the key holding their text.
TEXT_PART_KEYS = {"text": "text", "input_text": "text", "output_text": "text", "refusal": "refusal", "thinking": "thinking"}
#: Part types that carry media (need the model's processor: render backend only).
MEDIA_PART_TYPES = frozenset(
    {
        "image_url", "input_image", "image_pil", "image_embeds", "audio_url", "input_audio", "audio_embeds",
        "video_url", "video_embeds", "prompt_embeds", "image", "audio", "video",
    }
)
_MAX_CACHE_SALT_LENGTH = 128


def _bool(obj: Mapping[str, Any], key: str, default: bool) -> bool:
    value = obj.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise BadRequestError(f"{key}: expected a boolean")
    return value


def validate_cache_salt(value: Any) -> str | None:
    """vLLM's ``validate_cache_salt``: non-empty, ≤128 chars, none of ``@ / \\ NUL``."""
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise BadRequestError("cache_salt: Parameter 'cache_salt' must be a non-empty string if provided.")
    if len(value) > _MAX_CACHE_SALT_LENGTH or any(c in value for c in "@/\\\x00"):
        raise BadRequestError(
            "cache_salt: Parameter 'cache_salt' must be at most 128 characters and must not contain "
            "'@', '/', '\\\\', or NUL."
        )
    return value


# --- completions ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CompletionInput:
    """``/v1/completions`` prompts: text to tokenize, or token ids (``list[int]``) used verbatim."""

    prompts: tuple[str | tuple[int, ...], ...]
    add_special_tokens: bool = True
    cache_salt: str | None = None


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def parse_completion(obj: Mapping[str, Any]) -> CompletionInput:
    """Validate a completions body (raises :class:`BadRequestError` naming the field)."""
    if "prompt" not in obj or obj["prompt"] is None:
        raise BadRequestError("prompt: field required")
    prompt = obj["prompt"]
    prompts: list[str | tuple[int, ...]]
    if isinstance(prompt, str):
        prompts = [prompt]
    elif isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            prompts = list(prompt)
        elif all(_is_int(t) for t in prompt):
            prompts = [tuple(prompt)]
        elif all(isinstance(p, list) for p in prompt):
            for i, p in enumerate(prompt):
                if not p or not all(_is_int(t) and t >= 0 for t in p):
                    raise BadRequestError(f"prompt[{i}]: expected a non-empty list of non-negative integers")
            prompts = [tuple(p) for p in prompt]
        else:
            raise BadRequestError("prompt: a list must hold only strings, only token ids or only lists of token ids")
    else:
        raise BadRequestError("prompt: expected a string, a list of strings or token ids")
    for p in prompts:
        if isinstance(p, tuple) and any(t < 0 for t in p):
            raise BadRequestError("prompt: token ids must be non-negative")
    return CompletionInput(
        tuple(prompts), _bool(obj, "add_special_tokens", True), validate_cache_salt(obj.get("cache_salt"))
    )


# --- chat -----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ChatInput:
    """A chat request in the form the renderer needs."""

    messages: tuple[Mapping[str, Any], ...]
    tools: list[dict[str, Any]] | None = None
    documents: list[dict[str, Any]] | None = None
    chat_template: str | None = None
    chat_template_kwargs: Mapping[str, Any] = field(default_factory=dict)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False
    reasoning_effort: str | None = None
    tool_choice: Any = None
    cache_salt: str | None = None
    #: Some message has a non-text content part (image, audio, video, embeds).
    multimodal: bool = False


def _dump_tool(tool: Any, where: str) -> dict[str, Any]:
    """``ChatCompletionToolsParam.model_dump()``: ``None`` description/parameters kept, extras dropped."""
    if not isinstance(tool, dict):
        raise BadRequestError(f"{where}: expected an object")
    if tool.get("type", "function") != "function":
        raise BadRequestError(f"{where}.type: expected 'function'")
    fn = tool.get("function")
    if not isinstance(fn, dict):
        raise BadRequestError(f"{where}.function: field required")
    if not isinstance(fn.get("name"), str):
        raise BadRequestError(f"{where}.function.name: expected a string")
    desc, params = fn.get("description"), fn.get("parameters")
    if desc is not None and not isinstance(desc, str):
        raise BadRequestError(f"{where}.function.description: expected a string")
    if params is not None and not isinstance(params, dict):
        raise BadRequestError(f"{where}.function.parameters: expected an object")
    defer = tool.get("defer_loading")
    out_fn: dict[str, Any] = {"name": fn["name"], "description": desc, "parameters": params}
    for key in ("strict", "defer_loading"):
        value = fn.get(key)
        if key == "defer_loading" and value is None:
            value = defer
        if value is not None:
            if not isinstance(value, bool):
                raise BadRequestError(f"{where}.function.{key}: expected a boolean")
            out_fn[key] = value
    out: dict[str, Any] = {"type": "function", "function": out_fn}
    if defer is not None:
        out["defer_loading"] = defer
    return out


def _check_messages(messages: Any, where: str = "messages") -> tuple[tuple[Mapping[str, Any], ...], bool]:
    if not isinstance(messages, list) or not messages:
        raise BadRequestError(f"{where}: expected a non-empty array of messages")
    multimodal = False
    for i, m in enumerate(messages):
        w = f"{where}[{i}]"
        if not isinstance(m, dict):
            raise BadRequestError(f"{w}: expected an object")
        if not isinstance(m.get("role"), str):
            raise BadRequestError(f"{w}.role: expected a string")
        content = m.get("content")
        if content is None and "content" in m and m["role"] != "assistant":
            # Only the assistant message type of vLLM's ChatCompletionMessageParam union takes an
            # explicit null; the others (custom roles included) may omit content but not null it.
            raise BadRequestError(f"{w}.content: expected a string or an array of content parts")
        if isinstance(content, list):
            for j, part in enumerate(content):
                pw = f"{w}.content[{j}]"
                if not isinstance(part, dict):
                    # vLLM's ChatCompletionRequest validation refuses bare strings in a content
                    # array too ("Input should be a valid dictionary"), though its parser would
                    # take them (vllm/renderers/chat_utils.py _parse_chat_message_content_part).
                    raise BadRequestError(f"{pw}: expected an object")
                ptype = part.get("type")
                if ptype in TEXT_PART_KEYS:
                    text = part.get(TEXT_PART_KEYS[ptype])
                    if text is not None and not isinstance(text, str):
                        raise BadRequestError(f"{pw}.{TEXT_PART_KEYS[ptype]}: expected a string")
                elif ptype in MEDIA_PART_TYPES or (ptype is None and any(k in part for k in MEDIA_PART_TYPES)):
                    multimodal = True
                elif ptype != "tool_reference":
                    raise BadRequestError(f"{pw}.type: Unsupported chat content part type: {ptype!r}")
        elif content is not None and not isinstance(content, str):
            raise BadRequestError(f"{w}.content: expected a string, an array of content parts or null")
        calls = m.get("tool_calls")
        if calls is not None:
            if not isinstance(calls, list):
                raise BadRequestError(f"{w}.tool_calls: expected an array")
            for j, c in enumerate(calls):
                if not isinstance(c, dict) or not isinstance(c.get("function"), dict):
                    raise BadRequestError(f"{w}.tool_calls[{j}].function: expected an object")
    return tuple(messages), multimodal


def parse_chat(obj: Mapping[str, Any], *, allow_empty_tools: bool = False) -> ChatInput:
    """Validate a chat completions body (raises :class:`BadRequestError` naming the field).

    ``allow_empty_tools`` is for bodies converted from Anthropic ones: vLLM sets their ``tools``
    after validation, so an empty list passes there (``vllm/entrypoints/anthropic/serving.py``
    ``_convert_tools``).
    """
    if "messages" not in obj:
        raise BadRequestError("messages: field required")
    messages, multimodal = _check_messages(obj["messages"])
    tools_raw = obj.get("tools")
    tools = None
    if tools_raw is not None:
        if not isinstance(tools_raw, list):
            raise BadRequestError("tools: expected an array")
        if not tools_raw and not allow_empty_tools:  # ChatCompletionRequest.check_tool_usage (…/chat_completion/protocol.py)
            raise BadRequestError("tools: `tools` must not be an empty array. Either provide at least one tool or omit the field entirely.")
        tools = [_dump_tool(t, f"tools[{i}]") for i, t in enumerate(tools_raw)]
    documents = obj.get("documents")
    if documents is not None and not (isinstance(documents, list) and all(isinstance(d, dict) for d in documents)):
        raise BadRequestError("documents: expected an array of objects")
    template = obj.get("chat_template")
    if template is not None and not isinstance(template, str):
        raise BadRequestError("chat_template: expected a string")
    kwargs = obj.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise BadRequestError("chat_template_kwargs: expected an object")
    effort = obj.get("reasoning_effort")
    if effort is not None and not isinstance(effort, str):
        raise BadRequestError("reasoning_effort: expected a string")
    agp = _bool(obj, "add_generation_prompt", True)
    cfm = _bool(obj, "continue_final_message", False)
    if agp and cfm:
        raise BadRequestError("continue_final_message: Cannot set both continue_final_message and add_generation_prompt to True.")
    tool_choice = obj.get("tool_choice")
    if tool_choice is None:
        tool_choice = "auto" if tools else "none"
    return ChatInput(
        messages=messages,
        tools=tools,
        documents=documents,
        chat_template=template,
        chat_template_kwargs=kwargs,
        add_generation_prompt=agp,
        continue_final_message=cfm,
        add_special_tokens=_bool(obj, "add_special_tokens", False),
        reasoning_effort=effort,
        tool_choice=tool_choice,
        cache_salt=validate_cache_salt(obj.get("cache_salt")),
        multimodal=multimodal,
    )
