"""Tokens → block keys: llm-d's chained request keys (xxh64 and cbor-fnv) and their extras."""

from __future__ import annotations

from ppc_extproc.blockkeys.config import TokenProcessorConfig
from ppc_extproc.blockkeys.extras import (
    MultimodalFeature,
    compute_block_extras,
    fold_cache_salt,
    parse_raw_extra_keys,
    realign_extras,
)
from ppc_extproc.blockkeys.hashing import BlockExtras
from ppc_extproc.blockkeys.processor import TokenProcessor

__all__ = [
    "BlockExtras",
    "MultimodalFeature",
    "TokenProcessor",
    "TokenProcessorConfig",
    "compute_block_extras",
    "fold_cache_salt",
    "parse_raw_extra_keys",
    "realign_extras",
]
