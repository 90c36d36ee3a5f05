"""Data-layer plugins: sources (endpoint notifications, metrics polls) and their extractors."""

from __future__ import annotations

from ppc_extproc.plugins.datalayer.core_metrics_extractor import CoreMetricsExtractor
from ppc_extproc.plugins.datalayer.dcgm import DCGMDataSource, DCGMExtractor
from ppc_extproc.plugins.datalayer.endpoint_notification_source import EndpointNotificationSource
from ppc_extproc.plugins.datalayer.metrics_data_source import MetricsDataSource, PollOptions
from ppc_extproc.plugins.datalayer.redis_syncer import RedisSyncer

__all__ = [
    "CoreMetricsExtractor",
    "DCGMDataSource",
    "DCGMExtractor",
    "EndpointNotificationSource",
    "MetricsDataSource",
    "PollOptions",
    "RedisSyncer",
]
