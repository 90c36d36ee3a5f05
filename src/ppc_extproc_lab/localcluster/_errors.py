"""Errors of the local cluster launcher."""

from __future__ import annotations

from ppc_extproc.errors import PpcError

__all__ = ["LocalClusterError", "ReadinessError"]


class LocalClusterError(PpcError):
    """The local cluster could not be set up (no free port, no Envoy binary, bad Envoy config …)."""


class ReadinessError(LocalClusterError):
    """A process did not become ready in time or exited early; the message ends with its log tail."""
