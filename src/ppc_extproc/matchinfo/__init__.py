"""Index → match info: longest-prefix scoring and ``PrefixCacheMatchInfo``."""

from __future__ import annotations

from ppc_extproc.matchinfo.info import (
    PREFIX_MATCH_INFO_KEY,
    PrefixCacheMatchInfo,
    best_match_info,
    engine_cached_tokens,
    match_info_key,
)
from ppc_extproc.matchinfo.longest_prefix import PrefixScore, score_prefix_runs

__all__ = [
    "PREFIX_MATCH_INFO_KEY",
    "PrefixCacheMatchInfo",
    "PrefixScore",
    "best_match_info",
    "engine_cached_tokens",
    "match_info_key",
    "score_prefix_runs",
]
