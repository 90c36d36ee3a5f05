"""Producers: plugins that compute request data (token ids, prefix match info) for scorers."""

from __future__ import annotations

from ppc_extproc.plugins.producers.approx_prefix_cache import ApproxPrefixCacheProducer
from ppc_extproc.plugins.producers.burst_prefix_cache import BurstPrefixCacheProducer
from ppc_extproc.plugins.producers.inflight_load import InflightLoadProducer
from ppc_extproc.plugins.producers.p2p_source import P2PSourceProducer
from ppc_extproc.plugins.producers.precise_prefix_cache import PrecisePrefixCacheProducer
from ppc_extproc.plugins.producers.token_producer import TokenProducer
from ppc_extproc.plugins.producers.topology_extractor import TopologyExtractor

__all__ = [
    "ApproxPrefixCacheProducer",
    "BurstPrefixCacheProducer",
    "InflightLoadProducer",
    "P2PSourceProducer",
    "PrecisePrefixCacheProducer",
    "TokenProducer",
    "TopologyExtractor",
]
