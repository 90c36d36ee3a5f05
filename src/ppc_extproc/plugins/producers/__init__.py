"""Producers: plugins that compute request data (token ids, prefix match info) for scorers."""

from __future__ import annotations

from ppc_extproc.plugins.producers.agent_identity import AgentIdentity
from ppc_extproc.plugins.producers.approx_prefix_cache import ApproxPrefixCacheProducer
from ppc_extproc.plugins.producers.burst_prefix_cache import BurstPrefixCacheProducer
from ppc_extproc.plugins.producers.inflight_load import InflightLoadProducer
from ppc_extproc.plugins.producers.mm_embeddings_cache import MMEmbeddingsCacheProducer
from ppc_extproc.plugins.producers.p2p_source import P2PSourceProducer
from ppc_extproc.plugins.producers.precise_prefix_cache import PrecisePrefixCacheProducer
from ppc_extproc.plugins.producers.session_id import SessionIdProducer
from ppc_extproc.plugins.producers.token_producer import TokenProducer
from ppc_extproc.plugins.producers.topology_extractor import TopologyExtractor

__all__ = [
    "AgentIdentity",
    "ApproxPrefixCacheProducer",
    "BurstPrefixCacheProducer",
    "InflightLoadProducer",
    "MMEmbeddingsCacheProducer",
    "P2PSourceProducer",
    "PrecisePrefixCacheProducer",
    "SessionIdProducer",
    "TokenProducer",
    "TopologyExtractor",
]
