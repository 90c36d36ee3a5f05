"""Producers: plugins that compute per-endpoint attributes (prefix match info) for scorers."""

from __future__ import annotations

from ppc_extproc.plugins.producers.approx_prefix_cache import ApproxPrefixCacheProducer  # noqa: F401
from ppc_extproc.plugins.producers.precise_prefix_cache import PrecisePrefixCacheProducer

__all__ = ["PrecisePrefixCacheProducer"]
