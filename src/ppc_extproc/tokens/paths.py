"""The one table of request paths: for each API path suffix, the parser family that claims it, the
body field carrying token ids, and the API the tokenizer renders it as.

Paths match by suffix with the query string and a trailing ``/`` ignored, so a proxy prefix
(``/tenant-a/v1/completions``) matches too; the first matching row wins, so longer suffixes come
first. A path no row matches is read as completions (llm-d's default parser) with no API.

Parser claims follow ``llm-d/llm-d-router: pkg/epp/framework/plugins/requesthandling/parsers/*/``;
token fields and APIs follow vLLM's OpenAI-compatible server
(``vllm-project/vllm: vllm/entrypoints/openai/protocol.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = [
    "Api",
    "ParserFamily",
    "PathRoute",
    "TokenField",
    "api_for_path",
    "parser_suffixes",
    "route_for_path",
    "token_field_for_path",
]

Api = Literal["completions", "chat", "messages", "responses"]
ParserFamily = Literal["openai", "anthropic", "vllmhttp", "sglanghttp"]


@dataclass(frozen=True, slots=True)
class TokenField:
    """Which body field carries token ids for a request path."""

    name: str
    batch_allowed: bool
    features: bool = False


COMPLETIONS = TokenField("prompt", batch_allowed=True)
GENERATE = TokenField("token_ids", batch_allowed=False, features=True)
EMBEDDINGS = TokenField("input", batch_allowed=True)


@dataclass(frozen=True, slots=True)
class PathRoute:
    """One row of the path table."""

    suffix: str
    #: The parser family whose parser claims the suffix; None: only ``passthrough-parser`` does.
    parser: ParserFamily | None
    #: None for token-less APIs (chat, messages, responses).
    token_field: TokenField | None
    #: What the tokenizer renders the body as; None for bodies without a text prompt it renders.
    api: Api | None


ROUTES: tuple[PathRoute, ...] = (
    PathRoute("/inference/v1/generate", "vllmhttp", GENERATE, None),
    PathRoute("/chat/completions/render", "openai", COMPLETIONS, "chat"),
    PathRoute("/completions/render", "openai", COMPLETIONS, "completions"),
    PathRoute("/chat/completions", "openai", None, "chat"),
    PathRoute("/completions", "openai", COMPLETIONS, "completions"),
    PathRoute("/embeddings", "openai", EMBEDDINGS, None),
    PathRoute("/v1/responses/render", None, COMPLETIONS, "responses"),
    PathRoute("/v1/responses", "openai", None, "responses"),
    PathRoute("/responses", "openai", COMPLETIONS, None),
    PathRoute("/conversations", "openai", COMPLETIONS, None),
    PathRoute("/images/generations", "openai", COMPLETIONS, None),
    PathRoute("/v1/messages/render", None, COMPLETIONS, "messages"),
    PathRoute("/messages/count_tokens", "anthropic", COMPLETIONS, None),
    PathRoute("/v1/messages", "anthropic", None, "messages"),
    PathRoute("/messages", "anthropic", COMPLETIONS, None),
    PathRoute("/generate", "sglanghttp", COMPLETIONS, None),
)
#: What a path no row matches is read as.
DEFAULT_ROUTE = PathRoute("", None, COMPLETIONS, None)


def normalized(path: str) -> str:
    """The path as the table matches it: no query string, no trailing ``/``."""
    return path.split("?", 1)[0].rstrip("/")


def route_for_path(path: str) -> PathRoute:
    """The table row of a request path (``DEFAULT_ROUTE`` when none matches)."""
    bare = normalized(path)
    for route in ROUTES:
        if bare.endswith(route.suffix):
            return route
    return DEFAULT_ROUTE


def token_field_for_path(path: str) -> TokenField | None:
    """The token field of a request path; None for token-less APIs."""
    return route_for_path(path).token_field


def api_for_path(path: str) -> Api | None:
    """The API a request path's body is rendered as; None for bodies without text prompts."""
    return route_for_path(path).api


def parser_suffixes(family: ParserFamily) -> tuple[str, ...]:
    """The path suffixes a parser family claims (any path ending in one of them)."""
    return tuple(route.suffix for route in ROUTES if route.parser == family)
