"""``precise-prefix-cache-scorer``: a precise producer and its scorer in one (deprecated in llm-d).

Type        ``precise-prefix-cache-scorer`` (producer + scorer)
Behaviour   with exactly one ``precise-prefix-cache-producer`` configured (anywhere in the file),
            it becomes ``prefix-cache-scorer{prefixMatchInfoProducerName: <that producer>}`` and its
            own parameters are ignored; with two, loading fails. With none, it hosts a producer
            under its own name (parameters = the producer's; ``indexerConfig.tokenizersPoolConfig``
            becomes a ``token-producer``, with a deprecation warning, unless one is configured)
            and scores its match
            info as ``prefix-cache-scorer`` does.
Parameters  those of ``precise-prefix-cache-producer`` (used only when it hosts its own)

    plugins:
    - type: precise-prefix-cache-scorer       # deprecated; loads as the two plugins below
      parameters: {tokenProcessorConfig: {blockSizeTokens: 64}}
    # preferred:
    - type: precise-prefix-cache-producer
    - type: prefix-cache-scorer
      parameters: {prefixMatchInfoProducerName: precise-prefix-cache-producer}

Follows ``llm-d/llm-d-router: pkg/epp/framework/plugins/scheduling/scorer/preciseprefixcache/``.
"""

from __future__ import annotations

from collections.abc import Sequence

from ppc_extproc.framework import PREFIX_CACHE_MATCH_INFO, Consumes, Endpoint, SchedulingContext, Scorer
from ppc_extproc.framework.params import Section
from ppc_extproc.ids import EndpointId
from ppc_extproc.plugins.producers.precise_prefix_cache import PrecisePrefixCacheProducer
from ppc_extproc.plugins.producers.precise_prefix_cache_config import parse_producer_config
from ppc_extproc.plugins.registry import Services, register
from ppc_extproc.plugins.scorers.prefix_cache import prefix_score

__all__ = ["PrecisePrefixCacheScorer"]


@register("precise-prefix-cache-scorer")
class PrecisePrefixCacheScorer(PrecisePrefixCacheProducer, Scorer):
    @classmethod
    def from_parameters(cls, name: str, params: Section, services: Services) -> PrecisePrefixCacheScorer:
        indexer = params.data.get("indexerConfig")
        if isinstance(indexer, dict) and "tokenizersPoolConfig" in indexer:
            indexer = dict(indexer)
            indexer.pop("tokenizersPoolConfig")
            params.data["indexerConfig"] = indexer
            # Tokenizing is the token-producer's job: the loader adds one built from this section.
        return cls(name, parse_producer_config(params), services)

    def consumes(self) -> tuple[Consumes[object], ...]:
        """The producer's token ids, and (as a scorer) the match info it writes itself."""
        return (*super().consumes(), Consumes(PREFIX_CACHE_MATCH_INFO, self.name))

    def score(self, ctx: SchedulingContext, endpoints: Sequence[Endpoint]) -> dict[EndpointId, float]:
        return {e.id: prefix_score(ctx.endpoint_value(e.id, self.match_key)) for e in endpoints}
