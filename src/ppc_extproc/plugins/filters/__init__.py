"""Filters: narrow the candidate endpoints before scoring."""

from __future__ import annotations

from ppc_extproc.plugins.filters.prefix_cache_affinity import PrefixCacheAffinityFilter

__all__ = ["PrefixCacheAffinityFilter"]
