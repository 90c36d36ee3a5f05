"""Producers: plugins that compute request data (token ids, prefix match info) for scorers."""

from __future__ import annotations

from ppc_extproc.plugins.producers.approx_prefix_cache import ApproxPrefixCacheProducer
from ppc_extproc.plugins.producers.burst_prefix_cache import BurstPrefixCacheProducer
from ppc_extproc.plugins.producers.inflight_load import InflightLoadProducer
from ppc_extproc.plugins.producers.mm_embeddings_cache import MMEmbeddingsCacheProducer
from ppc_extproc.plugins.producers.precise_prefix_cache import PrecisePrefixCacheProducer
from ppc_extproc.plugins.producers.token_producer import TokenProducer

__all__ = [
    "ApproxPrefixCacheProducer",
    "BurstPrefixCacheProducer",
    "InflightLoadProducer",
    "MMEmbeddingsCacheProducer",
    "PrecisePrefixCacheProducer",
    "TokenProducer",
]
