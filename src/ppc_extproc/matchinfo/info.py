"""``PrefixCacheMatchInfo``: what the producer tells scorers about one endpoint."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

__all__ = ["PREFIX_MATCH_INFO_KEY", "PrefixCacheMatchInfo", "best_match_info", "match_info_key"]

#: Attribute key prefix; the full key names the producer (llm-d: ``PrefixCacheMatchInfoDataKey/<name>``).
PREFIX_MATCH_INFO_KEY = "PrefixCacheMatchInfoDataKey"


def match_info_key(producer_name: str) -> str:
    return f"{PREFIX_MATCH_INFO_KEY}/{producer_name}"


@dataclass(slots=True)
class PrefixCacheMatchInfo:
    """Prefix-cache match of one request on one endpoint, summed over the request's prompts."""

    #: int(tier-weighted longest consecutive prefix), truncated toward zero as llm-d does.
    match_blocks: int
    #: Full blocks in the request.
    total_blocks: int
    #: The producer's canonical block size.
    block_size_tokens: int
    #: Unweighted consecutive hit count.
    cached_block_count: int = 0
    #: Per tier, consecutive blocks from block 0 the endpoint holds in that tier.
    cached_blocks_by_tier: dict[str, int] = field(default_factory=dict)
    #: Multimodal-bearing blocks inside the cached prefix (single-prompt multimodal requests only).
    mm_match_blocks: int | None = None

    @property
    def cached_tokens(self) -> int:
        """Tokens the endpoint should not have to prefill again."""
        return self.cached_block_count * self.block_size_tokens

    def to_json(self) -> dict[str, object]:
        """The llm-d field names, as the debug API reports them."""
        out: dict[str, object] = {
            "matchBlocks": self.match_blocks,
            "totalBlocks": self.total_blocks,
            "blockSizeTokens": self.block_size_tokens,
            "cachedBlockCount": self.cached_block_count,
            "cachedBlocksByTier": dict(self.cached_blocks_by_tier),
        }
        if self.mm_match_blocks is not None:
            out["mm"] = {"matchBlocks": self.mm_match_blocks}
        return out


def best_match_info(values: Iterable[object]) -> PrefixCacheMatchInfo | None:
    """Among an endpoint's attributes, the match info with the longest cached prefix (the one to
    trust when several producers wrote one), or None."""
    best: PrefixCacheMatchInfo | None = None
    for value in values:
        if isinstance(value, PrefixCacheMatchInfo) and (best is None or value.cached_block_count > best.cached_block_count):
            best = value
    return best
