"""Scorers: map an endpoint to a score in [0, 1] for the request at hand."""

from __future__ import annotations

from ppc_extproc.plugins.scorers.active_request import ActiveRequestScorer
from ppc_extproc.plugins.scorers.endpoint_attribute import EndpointAttributeScorer
from ppc_extproc.plugins.scorers.kv_cache_utilization import KVCacheUtilizationScorer
from ppc_extproc.plugins.scorers.load_aware import LoadAwareScorer
from ppc_extproc.plugins.scorers.lora_affinity import LoraAffinityScorer
from ppc_extproc.plugins.scorers.mm_embeddings_cache import MMEmbeddingsCacheScorer
from ppc_extproc.plugins.scorers.no_hit_lru import NoHitLRUScorer
from ppc_extproc.plugins.scorers.precise_prefix_cache import PrecisePrefixCacheScorer
from ppc_extproc.plugins.scorers.prefix_cache import PrefixCacheScorer
from ppc_extproc.plugins.scorers.queue_depth import QueueScorer
from ppc_extproc.plugins.scorers.running_requests import RunningRequestsScorer
from ppc_extproc.plugins.scorers.session_affinity import SessionAffinityScorer
from ppc_extproc.plugins.scorers.token_load import TokenLoadScorer
from ppc_extproc.plugins.scorers.topology_affinity import TopologyAffinityScorer

__all__ = [
    "ActiveRequestScorer",
    "EndpointAttributeScorer",
    "KVCacheUtilizationScorer",
    "LoadAwareScorer",
    "LoraAffinityScorer",
    "MMEmbeddingsCacheScorer",
    "NoHitLRUScorer",
    "PrecisePrefixCacheScorer",
    "PrefixCacheScorer",
    "QueueScorer",
    "RunningRequestsScorer",
    "SessionAffinityScorer",
    "TokenLoadScorer",
    "TopologyAffinityScorer",
]
