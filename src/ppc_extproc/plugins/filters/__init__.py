"""Filters: narrow the candidate endpoints before scoring."""

from __future__ import annotations

from ppc_extproc.plugins.filters.endpoint_attribute import EndpointAttributeFilter
from ppc_extproc.plugins.filters.prefix_cache_affinity import PrefixCacheAffinityFilter
from ppc_extproc.plugins.filters.role import DecodeFilter

__all__ = ["DecodeFilter", "EndpointAttributeFilter", "PrefixCacheAffinityFilter"]
