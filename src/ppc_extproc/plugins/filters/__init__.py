"""Filters: narrow the candidate endpoints before scoring."""

from __future__ import annotations

from ppc_extproc.plugins.filters.endpoint_attribute import EndpointAttributeFilter
from ppc_extproc.plugins.filters.prefix_cache_affinity import PrefixCacheAffinityFilter
from ppc_extproc.plugins.filters.role import DecodeFilter, EncodeFilter, PrefillFilter
from ppc_extproc.plugins.filters.session_affinity import SessionAffinityFilter
from ppc_extproc.plugins.filters.topology_affinity import TopologyAffinityFilter

__all__ = [
    "DecodeFilter",
    "EncodeFilter",
    "EndpointAttributeFilter",
    "PrefillFilter",
    "PrefixCacheAffinityFilter",
    "SessionAffinityFilter",
    "TopologyAffinityFilter",
]
