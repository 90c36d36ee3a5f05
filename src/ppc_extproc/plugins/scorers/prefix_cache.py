"""``prefix-cache-scorer``: how much of the request an endpoint already caches.

Type        ``prefix-cache-scorer`` (scorer)
Formula     ratio = matchBlocks / totalBlocks
            len_s = min(1, matchBlocks × blockSizeTokens / matchLengthScaleTokens)²   (only if w > 0)
            score = (1 − w) × ratio + w × len_s                          w = matchLengthWeight
            No match info (no token ids, no full block) ⇒ 0 for everyone. Absolute, not
            normalised across endpoints.
Inputs      ``PrefixCacheMatchInfoDataKey/<producer>``
Parameters  ``prefixMatchInfoProducerName`` [""]: the producer to read — name your
            precise-prefix-cache-producer here; empty means the approximate producer, as in llm-d
            (the loader warns when a precise producer is configured but not named)
            ``matchLengthWeight`` [0, in [0, 1]], ``matchLengthScaleTokens`` [8192, > 0 when w > 0]

    plugins:
    - type: prefix-cache-scorer
      parameters: {prefixMatchInfoProducerName: precise-prefix-cache-producer}
    schedulingProfiles:
    - name: default
      plugins: [{pluginRef: prefix-cache-scorer, weight: 3}]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ppc_extproc.errors import ConfigError
from ppc_extproc.framework import (
    PREFIX_CACHE_MATCH_INFO,
    Consumes,
    DataConsumer,
    Endpoint,
    SchedulingContext,
    Scorer,
)
from ppc_extproc.framework.params import Section, decode, param
from ppc_extproc.ids import EndpointId
from ppc_extproc.matchinfo import PrefixCacheMatchInfo
from ppc_extproc.plugins.registry import Services, register

__all__ = ["APPROXIMATE_PRODUCER", "PrefixCacheScorer", "PrefixCacheScorerConfig", "prefix_score"]

#: The producer a scorer reads when ``prefixMatchInfoProducerName`` is empty (llm-d's fallback).
APPROXIMATE_PRODUCER = "approx-prefix-cache-producer"


def prefix_score(info: PrefixCacheMatchInfo | None, weight: float = 0.0, scale_tokens: int = 8192) -> float:
    """The formula above, for one endpoint's match info."""
    if info is None or info.total_blocks == 0:
        return 0.0
    ratio = info.match_blocks / info.total_blocks
    if weight <= 0:
        return ratio
    length = min(1.0, info.match_blocks * info.block_size_tokens / scale_tokens) ** 2
    return (1 - weight) * ratio + weight * length


@dataclass(frozen=True, slots=True)
class PrefixCacheScorerConfig:
    """The scorer's parameters."""

    match_length_weight: float = param("matchLengthWeight", 0.0, minimum=0.0, maximum=1.0)
    match_length_scale_tokens: int = param("matchLengthScaleTokens", 8192)
    #: "" ⇒ the approximate producer.
    producer_name: str = param("prefixMatchInfoProducerName", "")


@register("prefix-cache-scorer")
class PrefixCacheScorer(Scorer, DataConsumer):
    def __init__(
        self,
        name: str = "prefix-cache-scorer",
        producer_name: str = "",
        match_length_weight: float = 0.0,
        match_length_scale_tokens: int = 8192,
    ) -> None:
        self.name = name
        #: As configured ("" = not named: reads the approximate producer).
        self.producer_name = producer_name
        self.match_length_weight = match_length_weight
        self.match_length_scale_tokens = match_length_scale_tokens
        self.match_key = PREFIX_CACHE_MATCH_INFO.of(self.reads)

    @classmethod
    def from_parameters(cls, name: str, params: Section, services: Services) -> PrefixCacheScorer:
        config = decode(params, PrefixCacheScorerConfig)
        if config.match_length_weight > 0 and config.match_length_scale_tokens <= 0:
            raise ConfigError(
                params.child_path("matchLengthScaleTokens"),
                "must be greater than 0 when matchLengthWeight > 0",
            )
        return cls(name, config.producer_name, config.match_length_weight, config.match_length_scale_tokens)

    @property
    def reads(self) -> str:
        """The producer whose match info this scorer reads."""
        return self.producer_name or APPROXIMATE_PRODUCER

    def consumes(self) -> tuple[Consumes[object], ...]:
        return (Consumes(PREFIX_CACHE_MATCH_INFO, self.reads),)

    def score(self, ctx: SchedulingContext, endpoints: Sequence[Endpoint]) -> dict[EndpointId, float]:
        info_of = ctx.endpoint_values(self.match_key).get
        weight, scale = self.match_length_weight, self.match_length_scale_tokens
        return {e.id: prefix_score(info_of(e.id), weight, scale) for e in endpoints}
