"""Tokens in: request bodies → ``TokenizedPrompt`` (little-endian uint32 token ids)."""

from __future__ import annotations

from ppc_extproc.tokens.body import ParsedBody, TokenField, parse_body, token_field_for_path
from ppc_extproc.tokens.prompt import MultimodalFeature, TokenizedPrompt

__all__ = [
    "MultimodalFeature",
    "ParsedBody",
    "TokenField",
    "TokenizedPrompt",
    "parse_body",
    "token_field_for_path",
]
