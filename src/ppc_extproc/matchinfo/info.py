"""``PrefixCacheMatchInfo``: what the producer tells scorers about one endpoint."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

__all__ = ["PREFIX_MATCH_INFO_KEY", "PrefixCacheMatchInfo", "best_match_info", "engine_cached_tokens", "match_info_key"]

#: Attribute key prefix; the full key names the producer (llm-d: ``PrefixCacheMatchInfoDataKey/<name>``).
PREFIX_MATCH_INFO_KEY = "PrefixCacheMatchInfoDataKey"


def match_info_key(producer_name: str) -> str:
    return f"{PREFIX_MATCH_INFO_KEY}/{producer_name}"


def engine_cached_tokens(
    cached_blocks: int, block_size: int, prompt_tokens: int, engine_block_size: int | None = None
) -> int:
    """Tokens of a prompt the engine takes from its cache: whole blocks, and never the last
    prompt token, which vLLM always recomputes (a 512-token prompt of 16 cached 32-token blocks
    gets 480: ``vllm-project/vllm: vllm/v1/core/kv_cache_manager.py`` ``get_computed_blocks``).

    ``cached_blocks`` counts blocks of ``block_size`` (the hashing unit); the engine hits whole
    blocks of its own ``engine_block_size`` (default: the same), so a 100-token cached prefix on a
    64-token-block engine is 64 tokens."""
    if prompt_tokens <= 0 or cached_blocks <= 0:
        return 0
    unit = engine_block_size if engine_block_size and engine_block_size > 0 else block_size
    return min(cached_blocks * block_size // unit * unit, (prompt_tokens - 1) // unit * unit)


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
    #: Per prompt, the cached tokens the engine will use: its cached blocks, at most
    #: ``floor((n − 1) / block size)`` of them — vLLM always recomputes a prompt's last token
    #: (``vllm-project/vllm: vllm/v1/core/kv_cache_manager.py`` ``get_computed_blocks``).
    #: Empty: not known per prompt (the whole cached count is used).
    cached_tokens_per_prompt: tuple[int, ...] = field(default=(), compare=False)

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens the endpoint should not have to prefill again."""
        if self.cached_tokens_per_prompt:
            return sum(self.cached_tokens_per_prompt)
        return self.cached_block_count * self.block_size_tokens

    @property
    def reported_cached_tokens(self) -> int:
        """What the engine's usage will report: for a batch vLLM reports only the last prompt's."""
        if self.cached_tokens_per_prompt:
            return self.cached_tokens_per_prompt[-1]
        return self.cached_tokens

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
