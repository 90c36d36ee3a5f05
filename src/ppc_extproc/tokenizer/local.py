"""``LocalTokenizer``: vLLM's render result computed in-process from a HF model directory.

``LocalTokenizer.from_dir(DIR)`` loads ``tokenizer.json``, ``tokenizer_config.json`` and the chat
template(s). ``tokenize(api, body)`` returns the ids ``POST /v1/completions/render`` or
``/v1/chat/completions/render`` of vLLM 0.32 returns for the same body on a server running that
tokenizer with default chat flags (no ``--chat-template``, content format ``auto``, no
``--default-chat-template-kwargs``, ``--trust-request-chat-template`` off unless configured):

1. chat messages are parsed as ``vllm/renderers/chat_utils.py`` ``parse_chat_messages`` does
   (text parts joined with ``"\\n"`` for ``string``-format templates, billing header stripped from
   system text, tool call ``arguments`` decoded to objects, ``developer`` → ``system`` when the
   template lacks it);
2. the template renders as ``apply_chat_template(tokenize=False)`` (``chat_template.py``);
3. the text is encoded with ``add_special_tokens`` as the request says, piece by piece through
   the segment cache (``segments.py``).

Requests with media parts are not tokenized (``multimodal_needs_render``), nor Responses bodies
(``unsupported_body``). Malformed bodies raise :class:`~ppc_extproc.errors.BadRequestError`.
Synchronous and thread-safe; the GIL is held except inside ``tokenizers``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

import ppc_extproc.tokenizer.chat_template as ct
from ppc_extproc.errors import BadRequestError
from ppc_extproc.tokenizer.hf import HfTokenizer
from ppc_extproc.tokenizer.requests import (
    TEXT_PART_KEYS,
    Api,
    ChatInput,
    CompletionInput,
    anthropic_to_chat,
    has_inline_system,
    parse_chat,
    parse_completion,
)
from ppc_extproc.tokenizer.result import (
    MULTIMODAL_NEEDS_RENDER,
    TEMPLATE_ERROR,
    UNSUPPORTED_BODY,
    UNTRUSTED_CHAT_TEMPLATE,
    TokenizeResult,
)
from ppc_extproc.tokenizer.segments import DEFAULT_CACHE_BYTES, SegmentCache, encode_text
from ppc_extproc.tokens.body import json_object

__all__ = ["LocalTokenizer"]

_BILLING_HEADER = "x-anthropic-billing-header"
_ANTHROPIC_EFFORTS = ("low", "medium", "high", "xhigh", "max")
_UNTRUSTED = (
    "chat_template: Chat template is passed with request, but --trust-request-chat-template is not set. "
    "Refused request with untrusted chat template."
)


def merge_kwargs(defaults: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """vLLM's ``merge_kwargs`` (``vllm/renderers/params.py``): overrides win unless None or ``"auto"``."""
    return {**defaults, **{k: v for k, v in overrides.items() if v is not None and v != "auto"}}


def _part_text(part: Any) -> str | None:
    if isinstance(part, str):
        return part
    kind = part.get("type")
    key = TEXT_PART_KEYS.get(kind) if isinstance(kind, str) else None
    return None if key is None else part.get(key)


def _string_content(parts: list[Any]) -> str:
    """A ``string``-format message's content: its parts' texts joined with ``"\\n"``.

    As ``vllm/renderers/chat_utils.py`` ``_parse_chat_message_content_parts`` (wrap_dicts=False):
    each part parses to a string (a ``tool_reference`` to its ``name``) and only truthy results
    are kept, so empty texts add no separator (``["a", "", "b"]`` → ``"a\\nb"``).
    """
    texts = []
    for p in parts:
        text = p.get("name") if isinstance(p, dict) and p.get("type") == "tool_reference" else _part_text(p)
        if text:
            texts.append(text)
    return "\n".join(texts)


def _strip_billing(parts: list[Any]) -> list[Any]:
    """Drop Claude Code's billing-header line from system text parts (``chat_utils.py``)."""
    out = []
    for part in parts:
        text = part if isinstance(part, str) else part.get("text") if part.get("type") == "text" else None
        if not (isinstance(text, str) and text.startswith(_BILLING_HEADER)):
            out.append(part)
            continue
        rest = text.partition("\n")[2]
        if rest:
            out.append(rest if isinstance(part, str) else {**part, "text": rest})
    return out


def _arguments(value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        return value
    if not value:
        return {}
    parsed: Any = value
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except ValueError:
            return {}
    return parsed if isinstance(parsed, dict) else {}


def template_messages(messages: tuple[Mapping[str, Any], ...], content_format: ct.ContentFormat) -> list[dict[str, Any]]:
    """OpenAI messages → the conversation the chat template sees (vLLM ``parse_chat_messages``)."""
    out: list[dict[str, Any]] = []
    for msg in messages:
        role = msg["role"]
        raw = msg.get("content")
        if content_format == "string" and isinstance(raw, str) and role in ("user", "assistant") and len(msg) == 2:
            out.append({"role": role, "content": raw})  # the common case: nothing to parse
            continue
        parts: list[Any] = [] if raw is None else [{"type": "text", "text": raw}] if isinstance(raw, str) else list(raw)
        if role == "system":
            parts = _strip_billing(parts)
        conv: dict[str, Any] = {"role": role}
        if content_format == "openai":
            items: list[dict[str, Any]] = []
            for p in parts:
                text = _part_text(p)
                if isinstance(p, dict) and p.get("type") == "tool_reference":
                    items.append({"type": "tool_reference", "name": p.get("name")})
                elif text is not None:
                    items.append({"type": "text", "text": text})
            conv["content"] = items
        else:
            conv["content"] = _string_content(parts)
        if role == "assistant":
            calls = msg.get("tool_calls")
            if calls is not None:
                copied = []
                for c in calls:
                    fn = dict(c["function"])
                    fn["arguments"] = _arguments(fn.get("arguments"))
                    copied.append({**c, "function": fn})
                if copied:
                    conv["tool_calls"] = copied
            if msg.get("reasoning") is not None:
                conv["reasoning"] = conv["reasoning_content"] = msg["reasoning"]
        elif role == "tool":
            if "tool_call_id" in msg:
                conv["tool_call_id"] = msg["tool_call_id"]
            content = conv["content"]
            if isinstance(content, list) and all(isinstance(i, dict) and i.get("type") == "text" for i in content):
                conv["content"] = "\n".join(i.get("text", "") for i in content)
        for key in ("name", "task"):
            if isinstance(msg.get(key), str):
                conv[key] = msg[key]
        if role == "developer":
            conv["tools"] = msg.get("tools")
        out.append(conv)
    return out


def _consolidate_developer(conversation: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``developer`` → ``system``, all system messages merged at the front (``renderers/hf.py``)."""
    converted = []
    for m in conversation:
        if m["role"] == "developer":
            m = {k: v for k, v in m.items() if k != "tools"}
            m["role"] = "system"
        converted.append(m)
    texts: list[str] = []
    rest: list[dict[str, Any]] = []
    needs = False
    for i, m in enumerate(converted):
        if m["role"] == "system":
            if i > 0 or texts:
                needs = True
            content = m.get("content", "")
            if isinstance(content, list):
                content = "\n".join(
                    str(p["text"]) if isinstance(p, dict) else p for p in content if isinstance(p, str) or (isinstance(p, dict) and "text" in p)
                )
            if content:
                texts.append(content)
        else:
            rest.append(m)
    return [{"role": "system", "content": "\n\n".join(texts)}, *rest] if needs else converted


class LocalTokenizer:
    """In-process tokenization of completions, chat and Anthropic bodies (see module docstring)."""

    def __init__(
        self,
        tokenizer: HfTokenizer,
        templates: ct.ChatTemplates,
        *,
        cache: SegmentCache | None,
        trust_request_chat_template: bool = False,
        default_chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.templates = templates
        self.cache = cache
        self.trust_request_chat_template = trust_request_chat_template
        self.default_chat_template_kwargs = dict(default_chat_template_kwargs or {})
        self._merge_inline_system: bool | None = None
        self._disabled_effort: str | None = None

    @classmethod
    def from_dir(
        cls,
        directory: str | Path,
        *,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        cache: SegmentCache | None = None,
        trust_request_chat_template: bool = False,
        default_chat_template_kwargs: Mapping[str, Any] | None = None,
        chat_template: str | None = None,
    ) -> LocalTokenizer:
        """Load a HF model directory; ``cache_bytes=0`` disables the segment cache. ``chat_template``
        (the text of the engine's ``--chat-template``) replaces the directory's templates."""
        tok = HfTokenizer.from_dir(directory)
        templates = ct.ChatTemplates(chat_template) if chat_template is not None else ct.ChatTemplates.from_dir(directory, tok.config)
        if cache is None and cache_bytes > 0:
            cache = SegmentCache(cache_bytes)
        return cls(
            tok, templates, cache=cache, trust_request_chat_template=trust_request_chat_template,
            default_chat_template_kwargs=default_chat_template_kwargs,
        )

    # --- public API -------------------------------------------------------------------------------

    def tokenize(self, api: Api, body: Mapping[str, Any] | bytes) -> TokenizeResult:
        """Token ids of a request body of ``api``; raises ``BadRequestError`` for malformed bodies."""
        obj = body if isinstance(body, Mapping) else json_object(body)
        if api == "completions":
            return self.tokenize_completion(parse_completion(obj))
        if api == "chat":
            return self.tokenize_chat(parse_chat(obj))
        if api == "messages":
            return self.tokenize_chat(parse_chat(self.anthropic_chat_body(obj), allow_empty_tools=True))
        return TokenizeResult.failed(UNSUPPORTED_BODY, f"{api} bodies are not tokenized locally")

    def tokenize_completion(self, req: CompletionInput) -> TokenizeResult:
        prompts = tuple(
            np.asarray(p, dtype="<u4").tobytes() if isinstance(p, tuple) else self.encode(p, add_special_tokens=req.add_special_tokens)
            for p in req.prompts
        )
        return TokenizeResult(prompts, cache_salt=req.cache_salt)

    def tokenize_chat(self, req: ChatInput) -> TokenizeResult:
        if req.multimodal:
            return TokenizeResult.failed(MULTIMODAL_NEEDS_RENDER, "media content parts", req.cache_salt)
        untrusted = req.chat_template is not None or req.chat_template_kwargs.get("chat_template") is not None
        if untrusted and not self.trust_request_chat_template:
            # vLLM 0.32 refuses it (OnlineRenderer.validate_chat_template): the router does not
            # guess the engine's verdict, it routes by load.
            return TokenizeResult.failed(UNTRUSTED_CHAT_TEMPLATE, _UNTRUSTED, req.cache_salt)
        try:
            text = self.render_chat(req)
        except BadRequestError as exc:  # the template's own failure, not the body's shape
            return TokenizeResult.failed(TEMPLATE_ERROR, exc.message, req.cache_salt)
        return TokenizeResult((self.encode(text, add_special_tokens=req.add_special_tokens),), cache_salt=req.cache_salt)

    def encode(self, text: str, *, add_special_tokens: bool) -> bytes:
        """LE32 ids of ``text`` (segment-cached)."""
        return encode_text(self.tokenizer, text, add_special_tokens=add_special_tokens, cache=self.cache)

    def render_chat(self, req: ChatInput) -> str:
        """The prompt text vLLM renders for a chat request (``apply_chat_template(tokenize=False)``)."""
        if req.chat_template is not None and not self.trust_request_chat_template:
            raise BadRequestError(_UNTRUSTED)
        source = self.templates.resolve(req.chat_template, has_tools=req.tools is not None)
        fmt = ct.detect_content_format(source)
        conversation = template_messages(req.messages, fmt)
        if any(m["role"] == "developer" for m in conversation) and '"developer"' not in source and "'developer'" not in source:
            conversation = _consolidate_developer(conversation)
        # As vLLM 0.32: the request's kwargs (with reasoning_effort's extras) over the server's
        # --default-chat-template-kwargs (ChatCompletionRequest.build_chat_params, ChatParams.with_defaults).
        extras: dict[str, Any] = {}
        if req.reasoning_effort is not None:
            extras["reasoning_effort"] = req.reasoning_effort
            if "enable_thinking" not in req.chat_template_kwargs:
                extras["enable_thinking"] = req.reasoning_effort != "none"
        kwargs = merge_kwargs(self.default_chat_template_kwargs, merge_kwargs(req.chat_template_kwargs, extras))
        tools = kwargs.pop("tools", None) if req.tools is None else req.tools
        documents = req.documents if req.documents is not None else kwargs.pop("documents", None)
        return ct.render(
            source,
            conversation,
            tools=tools,
            documents=documents,
            add_generation_prompt=req.add_generation_prompt,
            continue_final_message=req.continue_final_message,
            special_tokens=self.tokenizer.special_tokens_map,
            kwargs=ct.accepted_kwargs(source, kwargs),
        )

    def anthropic_chat_body(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """The chat body vLLM 0.32 builds for an Anthropic Messages body on this model."""
        merge = self.merge_inline_system() if has_inline_system(obj) else False
        thinking = obj.get("thinking")
        disabled = self.disabled_thinking_effort() if isinstance(thinking, dict) and thinking.get("type") == "disabled" else "none"
        return anthropic_to_chat(obj, merge_inline_system=merge, disabled_thinking_effort=disabled)

    # --- vLLM's startup probes (vllm/entrypoints/anthropic/serving.py) ----------------------------------

    def merge_inline_system(self) -> bool:
        """``_should_merge_inline_system``: a template (with or without tools) rejects ``[s, u, s, u]``."""
        if self._merge_inline_system is None:
            import jinja2.sandbox

            merge = False
            for has_tools in (False, True):
                try:
                    source = self.templates.resolve(None, has_tools=has_tools)
                except BadRequestError:
                    merge = True
                    break
                env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
                probe = [{"role": r, "content": "t"} for r in ("system", "user", "system", "user")]
                try:
                    env.from_string(source).render(messages=probe, add_generation_prompt=False)
                except jinja2.TemplateError:
                    merge = True
                    break
            self._merge_inline_system = merge
        return self._merge_inline_system

    def disabled_thinking_effort(self) -> str:
        """``_probe_disabled_thinking_effort``: ``low`` if ``none`` fails or renders like an effort."""
        if self._disabled_effort is None:
            def probe(effort: str) -> bytes | None:
                try:
                    res = self.tokenize_chat(parse_chat({"messages": [{"role": "user", "content": "Hi"}], "reasoning_effort": effort}))
                except BadRequestError:
                    return None
                return res.prompts[0] if res.ok else None

            none = probe("none")
            self._disabled_effort = "low" if none is None or any(probe(e) == none for e in _ANTHROPIC_EFFORTS) else "none"
        return self._disabled_effort
