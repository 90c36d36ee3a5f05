"""ppc-extproc: an Envoy ext_proc endpoint picker that routes LLM requests by precise KV-prefix-cache locality."""

from __future__ import annotations

from ppc_extproc.errors import ConfigError, PpcError, RequestError, WireError

__all__ = ["ConfigError", "PpcError", "RequestError", "WireError", "__version__"]

__version__ = "0.1.0"
