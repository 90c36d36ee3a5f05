"""Scorers: map an endpoint to a score in [0, 1] for the request at hand."""

from __future__ import annotations

from ppc_extproc.plugins.scorers.active_request import ActiveRequestScorer
from ppc_extproc.plugins.scorers.prefix_cache import PrefixCacheScorer

__all__ = ["ActiveRequestScorer", "PrefixCacheScorer"]
