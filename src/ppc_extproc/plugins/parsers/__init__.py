"""Request parsers (``requestHandler.parsers``): which request paths the service handles.

Types       ``openai-parser`` (completions, chat completions, embeddings, responses,
            conversations, the render paths, image generations), ``anthropic-parser``
            (``messages``, ``messages/count_tokens``), ``vllmhttp-parser``
            (``inference/v1/generate``), ``sglanghttp-parser`` (``generate``),
            ``passthrough-parser`` (any path; no body type)
Behaviour   ppc-extproc parses every body kind built in. Without ``requestHandler.parsers`` every
            path is handled (llm-d's default list ends with the passthrough parser). With an
            explicit list, a path no listed parser claims gets 400, as in llm-d. Paths match by
            suffix (query string ignored), so ``/v1/chat/completions`` and a proxy prefix both match.
Parameters  none

    plugins:
    - type: openai-parser
    requestHandler:
      parsers: [{pluginRef: openai-parser}]

Claims follow ``llm-d/llm-d-router: pkg/epp/framework/plugins/requesthandling/parsers/*/``; the
suffixes are the path table's (``ppc_extproc.tokens.paths``).
"""

from __future__ import annotations

from ppc_extproc.framework import RequestParser
from ppc_extproc.framework.params import Section
from ppc_extproc.plugins.registry import Services, register
from ppc_extproc.tokens.paths import normalized, parser_suffixes

__all__ = ["DEFAULT_PARSERS", "BuiltinParser", "claims_path"]

#: llm-d's ``requestHandler.parsers`` default, each auto-instantiated by type name.
DEFAULT_PARSERS = ("openai-parser", "anthropic-parser", "vllmhttp-parser", "passthrough-parser")


class BuiltinParser(RequestParser):
    #: Path suffixes; None claims every path.
    PATHS: tuple[str, ...] | None = ()

    def __init__(self, name: str) -> None:
        self.name = name

    @classmethod
    def from_parameters(cls, name: str, params: Section, services: Services) -> BuiltinParser:
        return cls(name)

    def claims(self) -> tuple[str, ...] | None:
        return self.PATHS


def _doc(type_name: str, claims: str) -> str:
    """A parser type's documentation (``plugin_doc``): what it claims and how it is configured."""
    return f"""``{type_name}``: claims {claims}.

    Type        ``{type_name}`` (request parser)
    Parameters  none

        plugins:
        - type: {type_name}
        requestHandler:
          parsers: [{{pluginRef: {type_name}}}]
    """


@register("openai-parser")
class OpenAIParser(BuiltinParser):
    __doc__ = _doc("openai-parser", "completions, chat completions, embeddings, responses, conversations, "
                   "the render paths, image generations")
    PATHS = parser_suffixes("openai")


@register("anthropic-parser")
class AnthropicParser(BuiltinParser):
    __doc__ = _doc("anthropic-parser", "``messages`` and ``messages/count_tokens``")
    PATHS = parser_suffixes("anthropic")


@register("vllmhttp-parser")
class VllmHttpParser(BuiltinParser):
    __doc__ = _doc("vllmhttp-parser", "vLLM's ``inference/v1/generate``")
    PATHS = parser_suffixes("vllmhttp")


@register("sglanghttp-parser")
class SGLangHttpParser(BuiltinParser):
    __doc__ = _doc("sglanghttp-parser", "SGLang's ``generate``")
    PATHS = parser_suffixes("sglanghttp")


@register("passthrough-parser")
class PassthroughParser(BuiltinParser):
    __doc__ = _doc("passthrough-parser", "every path, with no body type")
    PATHS = None


def claims_path(parsers: list[RequestParser], path: str) -> bool:
    """Whether one of ``parsers`` handles ``path``."""
    path = normalized(path)
    for parser in parsers:
        paths = parser.claims()
        if paths is None or any(path.endswith(suffix) for suffix in paths):
            return True
    return False
