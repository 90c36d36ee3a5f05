"""``mm-embeddings-cache-scorer``: prefer endpoints that already encoded this request's multimodal items.

Type        ``mm-embeddings-cache-scorer`` (scorer)
Formula     ``matched items / request items`` from the producer's ``EncoderCacheMatchInfo``;
            no match info (a text-only request) or no items ⇒ 0 for that endpoint
Consumes    ``MultiModalEncoderCacheMatchInfoKey/<producerName>`` (the loader creates the default
            ``mm-embeddings-cache-producer`` when the named one is that and it is not configured)
Parameters  ``producerName`` ["" ⇒ ``mm-embeddings-cache-producer``]

    plugins:
    - type: mm-embeddings-cache-producer
      parameters: {cacheSizeInMBPerServer: 2048}
    - type: mm-embeddings-cache-scorer
    schedulingProfiles:
    - name: default
      plugins: [{pluginRef: mm-embeddings-cache-scorer, weight: 4}]

Follows ``llm-d/llm-d-router: pkg/epp/framework/plugins/scheduling/scorer/mmcacheaffinity/scorer.go``.
"""

from __future__ import annotations

from collections.abc import Sequence

from ppc_extproc.framework import Consumes, DataConsumer, Endpoint, SchedulingContext, Scorer
from ppc_extproc.framework.params import Section
from ppc_extproc.ids import EndpointId
from ppc_extproc.plugins.producers.mm_embeddings_cache import MM_EMBEDDINGS_CACHE_PRODUCER, MM_ENCODER_CACHE_MATCH_INFO
from ppc_extproc.plugins.registry import Services, register

__all__ = ["MMEmbeddingsCacheScorer"]


@register("mm-embeddings-cache-scorer")
class MMEmbeddingsCacheScorer(Scorer, DataConsumer):
    def __init__(self, name: str = "mm-embeddings-cache-scorer", producer_name: str = "") -> None:
        self.name = name
        self.producer_name = producer_name or MM_EMBEDDINGS_CACHE_PRODUCER
        self.match_key = MM_ENCODER_CACHE_MATCH_INFO.of(self.producer_name)

    @classmethod
    def from_parameters(cls, name: str, params: Section, services: Services) -> MMEmbeddingsCacheScorer:
        return cls(name, params.string("producerName", ""))

    def consumes(self) -> tuple[Consumes[object], ...]:
        return (Consumes(MM_ENCODER_CACHE_MATCH_INFO, self.producer_name),)

    def score(self, ctx: SchedulingContext, endpoints: Sequence[Endpoint]) -> dict[EndpointId, float]:
        scores: dict[EndpointId, float] = {}
        for endpoint in endpoints:
            info = ctx.endpoint_value(endpoint.id, self.match_key)
            ok = info is not None and info.request_items > 0
            scores[endpoint.id] = info.matched_items / info.request_items if ok and info is not None else 0.0
        return scores
