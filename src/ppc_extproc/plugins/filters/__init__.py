"""Filters: narrow the candidate endpoints before scoring."""

from __future__ import annotations

from ppc_extproc.plugins.filters.prefix_cache_affinity import PrefixCacheAffinityFilter
from ppc_extproc.plugins.filters.role import DecodeFilter
from ppc_extproc.plugins.filters.session_affinity import SessionAffinityFilter

__all__ = ["DecodeFilter", "PrefixCacheAffinityFilter", "SessionAffinityFilter"]
