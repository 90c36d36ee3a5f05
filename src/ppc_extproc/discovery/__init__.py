"""Endpoint discovery: sources that keep the endpoint pool current.

A source is anything with ``async run(pool, stop)``: it puts the first endpoint list into the pool
(readiness waits for it), then keeps the pool current until ``stop`` is set. Static endpoints and
a watched YAML file are built in; a Kubernetes watcher is one more class with the same method.
"""

from __future__ import annotations

from ppc_extproc.discovery.file import FileDiscovery, parse_endpoints_document
from ppc_extproc.discovery.notification_source import EndpointNotificationSource
from ppc_extproc.discovery.static import StaticDiscovery

__all__ = ["EndpointNotificationSource", "FileDiscovery", "StaticDiscovery", "parse_endpoints_document"]
