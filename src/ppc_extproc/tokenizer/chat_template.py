"""Chat templates of a model directory, rendered as transformers' ``apply_chat_template`` under vLLM.

Resolution (``huggingface/transformers`` v5.19 ``tokenization_utils_base.py`` ``from_pretrained`` /
``get_chat_template``): ``chat_template.jinja`` and ``additional_chat_templates/<name>.jinja`` take
priority over ``tokenizer_config.json``'s ``chat_template`` (a string, or a list of
``{name, template}``); with several templates a request's template *name* selects one, else
``tool_use`` when tools are given, else ``default``.

Rendering (``src/transformers/utils/chat_template_utils.py`` ``_compile_jinja_template``,
``render_jinja_template``): ``jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True,
lstrip_blocks=True)`` with ``loopcontrols`` and a ``{% generation %}`` tag; filter ``tojson`` =
``json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)``; globals
``raise_exception`` and ``strftime_now`` (local wall clock). Template variables: ``messages``,
``tools``, ``documents``, ``add_generation_prompt``, the named special tokens as strings, then the
remaining keyword arguments. ``continue_final_message`` appends ``"CONTINUE_FINAL_MESSAGE_TAG "``
to the final message's content (or last text part) and cuts the rendered text there.

vLLM 0.32 (``vllm/renderers/hf.py``): the content format (``string`` or ``openai``) is detected
from the template's AST, and keyword arguments the template never reads (nor
``apply_chat_template`` parameters) are dropped.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import jinja2
import jinja2.ext
import jinja2.meta
import jinja2.nodes
import jinja2.sandbox

from ppc_extproc.errors import BadRequestError

__all__ = [
    "CONTINUE_FINAL_MESSAGE_TAG",
    "ChatTemplates",
    "ContentFormat",
    "TemplateError",
    "detect_content_format",
    "render",
]

CONTINUE_FINAL_MESSAGE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "
ContentFormat = Literal["string", "openai"]

#: ``PythonBackend.apply_chat_template`` parameters (transformers 5.19): accepted as kwargs by vLLM.
HF_APPLY_PARAMS = frozenset(
    {
        "conversation", "tools", "documents", "chat_template", "add_generation_prompt", "continue_final_message",
        "tokenize", "padding", "truncation", "max_length", "return_tensors", "return_dict",
        "return_assistant_tokens_mask", "tokenizer_kwargs",
    }
)
#: Those ``apply_chat_template`` consumes itself (they never reach the template as variables).
_CONSUMED_PARAMS = HF_APPLY_PARAMS - {"conversation"}
_COMPILED_MAX = 32


class TemplateError(BadRequestError):
    """The template rejected the request (``raise_exception``) or could not render it (400)."""


class _GenerationTag(jinja2.ext.Extension):
    """``{% generation %}…{% endgeneration %}``: renders its body (assistant masks are not needed)."""

    tags = {"generation"}  # noqa: RUF012 - jinja2's Extension API

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        return str(caller())


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _environment() -> jinja2.sandbox.ImmutableSandboxedEnvironment:
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


_ENV = _environment()
_compiled: OrderedDict[str, tuple[jinja2.Template, frozenset[str], ContentFormat]] = OrderedDict()
_compiled_lock = threading.Lock()


def _compile(source: str) -> tuple[jinja2.Template, frozenset[str], ContentFormat]:
    """Compiled template, its undeclared variables and its content format (bounded LRU)."""
    with _compiled_lock:
        hit = _compiled.get(source)
        if hit is not None:
            _compiled.move_to_end(source)
            return hit
    try:
        ast = _ENV.parse(source)
        entry = (_ENV.from_string(source), frozenset(jinja2.meta.find_undeclared_variables(ast)), _content_format(ast))
    except jinja2.TemplateError as exc:
        raise TemplateError(f"chat_template: invalid template: {exc}") from None
    with _compiled_lock:
        _compiled[source] = entry
        while len(_compiled) > _COMPILED_MAX:
            _compiled.popitem(last=False)
    return entry


# --- content format detection (vllm/renderers/hf.py _detect_content_format) ------------------------


def _is_name(node: jinja2.nodes.Node, name: str) -> bool:
    return isinstance(node, jinja2.nodes.Name) and node.ctx == "load" and node.name == name


def _is_attr(node: jinja2.nodes.Node, name: str, key: str) -> bool:
    if isinstance(node, jinja2.nodes.Getitem):
        return _is_name(node.node, name) and isinstance(node.arg, jinja2.nodes.Const) and node.arg.value == key
    if isinstance(node, jinja2.nodes.Getattr):
        return _is_name(node.node, name) and node.attr == key
    return False


def _accesses(node: jinja2.nodes.Node, name: str, key: str | None = None) -> bool:
    """``name`` (or ``name.key``), possibly under filters, tests or a slice."""
    if isinstance(node, jinja2.nodes.Filter):
        return node.node is not None and _accesses(node.node, name, key)
    if isinstance(node, jinja2.nodes.Test):
        return _accesses(node.node, name, key)
    if isinstance(node, jinja2.nodes.Getitem) and isinstance(node.arg, jinja2.nodes.Slice):
        return _accesses(node.node, name, key)
    return _is_attr(node, name, key) if key else _is_name(node, name)


def _aliases(root: jinja2.nodes.Template, name: str) -> list[str]:
    """``name`` and every variable assigned from it (transitively)."""
    found, queue = [name], [name]
    while queue:
        current = queue.pop(0)
        for assign in root.find_all(jinja2.nodes.Assign):
            if isinstance(assign.target, jinja2.nodes.Name) and _accesses(assign.node, current):
                target = assign.target.name
                if target not in found:
                    found.append(target)
                    queue.append(target)
    return found


def _message_vars(root: jinja2.nodes.Template) -> Iterator[str]:
    names = _aliases(root, "messages")
    for loop in root.find_all(jinja2.nodes.For):
        if isinstance(loop.target, jinja2.nodes.Name) and any(_accesses(loop.iter, n) for n in names):
            yield loop.target.name


def _content_format(root: jinja2.nodes.Template) -> ContentFormat:
    message_vars = list(_message_vars(root))
    macro_params: dict[int, set[str]] = {}
    in_macros: set[int] = set()
    for macro in root.find_all(jinja2.nodes.Macro):
        names = {a.name for a in macro.args}
        params: set[str] = set()
        for call in root.find_all(jinja2.nodes.Call):
            if isinstance(call.node, jinja2.nodes.Name) and call.node.name == macro.name:
                for i, arg in enumerate(call.args):
                    if i < len(macro.args) and any(_accesses(arg, v, "content") for v in message_vars):
                        params.add(macro.args[i].name)
                for kw in call.kwargs:
                    if kw.key in names and any(_accesses(kw.value, v, "content") for v in message_vars):
                        params.add(kw.key)
        for loop in macro.find_all(jinja2.nodes.For):
            in_macros.add(id(loop))
            if params:
                macro_params[id(loop)] = params
    for loop in root.find_all(jinja2.nodes.For):
        it = loop.iter
        if any(_accesses(it, v, "content") for v in message_vars):
            return "openai"
        if isinstance(it, jinja2.nodes.Name):
            if it.name in macro_params.get(id(loop), ()):
                return "openai"
            if id(loop) not in in_macros and it.name == "content":
                return "openai"
    return "string"


def detect_content_format(source: str) -> ContentFormat:
    """``openai`` if the template loops over a message's content parts, else ``string``."""
    return _compile(source)[2]


# --- resolution -----------------------------------------------------------------------------------


class ChatTemplates:
    """The chat template(s) of a model directory."""

    def __init__(self, templates: Mapping[str, str] | str | None) -> None:
        self._templates = templates

    @classmethod
    def from_dir(cls, directory: str | Path, config: Mapping[str, Any]) -> ChatTemplates:
        path = Path(directory)
        found: dict[str, str] = {}
        if (path / "chat_template.jinja").is_file():
            found["default"] = (path / "chat_template.jinja").read_text(encoding="utf-8")
        extra = path / "additional_chat_templates"
        if extra.is_dir():
            for f in sorted(extra.glob("*.jinja")):
                found[f.stem] = f.read_text(encoding="utf-8")
        if len(found) == 1 and "default" in found:
            return cls(found["default"])
        if found:
            return cls(found)
        value = config.get("chat_template")
        if isinstance(value, list):
            return cls({str(t["name"]): str(t["template"]) for t in value if isinstance(t, dict)})
        if isinstance(value, (str, dict)):
            return cls(value)
        return cls(None)

    @property
    def available(self) -> bool:
        return self._templates is not None

    def resolve(self, requested: str | None, *, has_tools: bool) -> str:
        """The template source for a request (``requested`` = a request's template or its name)."""
        templates = self._templates
        if isinstance(templates, Mapping):
            if requested is not None and requested in templates:
                return templates[requested]
            if requested is None:
                if has_tools and "tool_use" in templates:
                    return templates["tool_use"]
                if "default" in templates:
                    return templates["default"]
                raise TemplateError(
                    "This model has multiple chat templates with no default specified! Available template names "
                    f"are {sorted(templates)}."
                )
            return requested
        if requested is not None:
            return requested
        if templates is None:
            raise TemplateError(
                "As of transformers v4.44, default chat template is no longer allowed, so you must provide a chat "
                "template if the tokenizer does not define one."
            )
        return templates


# --- rendering ------------------------------------------------------------------------------------


def render(
    source: str,
    messages: list[dict[str, Any]],
    *,
    tools: list[dict[str, Any]] | None,
    documents: list[dict[str, Any]] | None,
    add_generation_prompt: bool,
    continue_final_message: bool,
    special_tokens: Mapping[str, str],
    kwargs: Mapping[str, Any],
) -> str:
    """Render ``messages`` (already parsed to template form) as ``apply_chat_template(tokenize=False)``.

    ``kwargs`` are the request's template variables after vLLM's filtering (see
    :func:`accepted_kwargs`); those ``apply_chat_template`` consumes itself are not passed on.
    Raises :class:`TemplateError` (400) with the template's own message.
    """
    template, _, _ = _compile(source)
    if not messages:
        raise BadRequestError("messages: Cannot apply chat template to an empty conversation.")
    if continue_final_message and add_generation_prompt:
        raise BadRequestError("Cannot set both continue_final_message and add_generation_prompt to True.")
    final_text: str | None = None
    if continue_final_message:
        final = messages[-1].get("content")
        if final is None:
            raise TemplateError('continue_final_message is set but the final message has no "content" to continue!')
        if "content" not in source:
            raise TemplateError(
                'continue_final_message is set to "content" but this is not an accepted field in the chat_template'
            )
        last = dict(messages[-1])
        if isinstance(final, (list, tuple)):
            parts = [dict(p) if isinstance(p, dict) else p for p in final]
            for part in reversed(parts):
                if isinstance(part, dict) and "text" in part:
                    final_text = str(part["text"])
                    part["text"] = final_text + CONTINUE_FINAL_MESSAGE_TAG
                    break
            else:
                raise TemplateError("continue_final_message is set but we could not find any text to continue in the final message!")
            last["content"] = parts
        else:
            final_text = str(final)
            last["content"] = final_text + CONTINUE_FINAL_MESSAGE_TAG
        messages = [*messages[:-1], last]
    variables: dict[str, Any] = dict(special_tokens)
    variables.update((k, v) for k, v in kwargs.items() if k not in _CONSUMED_PARAMS)
    variables.update(messages=messages, tools=tools, documents=documents, add_generation_prompt=add_generation_prompt)
    try:
        text = template.render(**variables)
    except jinja2.TemplateError as exc:
        raise TemplateError(str(exc)) from None
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        raise TemplateError(f"chat template failed: {exc}") from None
    if final_text is not None:
        tag = CONTINUE_FINAL_MESSAGE_TAG.strip()
        if final_text.strip() not in text or tag not in text:
            raise TemplateError(
                "continue_final_message is set but the final message does not appear in the chat after applying "
                "the chat template!"
            )
        loc = text.rindex(tag)
        text = text[:loc] if text[loc : loc + len(CONTINUE_FINAL_MESSAGE_TAG)] == CONTINUE_FINAL_MESSAGE_TAG else text[:loc].rstrip()
    return text


def accepted_kwargs(source: str, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """vLLM's ``resolve_chat_template_kwargs``: keep keys the template reads or HF accepts."""
    bad = {"chat_template", "tokenize"} & kwargs.keys()
    if bad:
        raise BadRequestError(f"chat_template_kwargs: Found unexpected chat template kwargs from request: {bad}")
    template_vars = _compile(source)[1]
    return {k: v for k, v in kwargs.items() if k in template_vars or k in HF_APPLY_PARAMS}
