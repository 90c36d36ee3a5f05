"""Tokens in: request bodies → ``TokenizedPrompt`` (little-endian uint32 token ids)."""

from __future__ import annotations

from ppc_extproc.tokens.body import ParsedBody, TokenField, parse_body, token_field_for_path
from ppc_extproc.tokens.le32 import le32_to_array, tokens_to_le32
from ppc_extproc.tokens.prompt import MultimodalFeature, TokenizedPrompt

__all__ = [
    "MultimodalFeature",
    "ParsedBody",
    "TokenField",
    "TokenizedPrompt",
    "le32_to_array",
    "parse_body",
    "token_field_for_path",
    "tokens_to_le32",
]
