"""Tokens in: request bodies → ``TokenizedPrompt`` (little-endian uint32 token ids)."""

from __future__ import annotations

from ppc_extproc.tokens.body import ParsedBody, parse_body
from ppc_extproc.tokens.le32 import le32_to_array, tokens_to_le32
from ppc_extproc.tokens.paths import Api, PathRoute, TokenField, api_for_path, route_for_path, token_field_for_path
from ppc_extproc.tokens.prompt import MultimodalFeature, TokenizedPrompt

__all__ = [
    "Api",
    "MultimodalFeature",
    "ParsedBody",
    "PathRoute",
    "TokenField",
    "TokenizedPrompt",
    "api_for_path",
    "le32_to_array",
    "parse_body",
    "route_for_path",
    "token_field_for_path",
    "tokens_to_le32",
]
