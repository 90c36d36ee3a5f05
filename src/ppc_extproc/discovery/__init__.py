"""Endpoint discovery: the edge of the data layer that keeps the endpoint pool current.

A source plays the ``Discovery`` role (``async run(registry, stop)``): it puts the first complete
endpoint list into the pool (readiness waits for it), then keeps it current until ``stop`` is
set. Static endpoints and a watched YAML file are built in.
"""

from __future__ import annotations

from ppc_extproc.discovery.file import FileDiscovery, parse_endpoints_document
from ppc_extproc.discovery.static import StaticDiscovery

__all__ = ["FileDiscovery", "StaticDiscovery", "parse_endpoints_document"]
