"""Exceptions raised by ppc-extproc.

    PpcError
    ├── ConfigError        bad configuration; carries the dotted path of the field
    ├── BindError          a listening socket cannot be bound; names the flag that chose it
    ├── RequestError       a request the service refuses; carries the HTTP status
    │   ├── BadRequestError        400
    │   ├── PayloadTooLargeError   413
    │   ├── SaturatedError         429 (filters removed every endpoint)
    │   ├── SchedulingError        429 (the profile handler found no target)
    │   ├── ProtocolConfigError    500 (the data plane announced a mode this service lacks)
    │   └── NoEndpointsError       503
    └── WireError          a KV-event message or event that cannot be decoded

Errors of other libraries (grpc, zmq, msgpack) are mapped to these at the boundary.
"""

from __future__ import annotations

import errno
import os
import socket

__all__ = [
    "BadRequestError",
    "BindError",
    "ConfigError",
    "NoEndpointsError",
    "PayloadTooLargeError",
    "PpcError",
    "ProtocolConfigError",
    "RequestError",
    "SaturatedError",
    "SchedulingError",
    "WireError",
]


class PpcError(Exception):
    """Root of every error ppc-extproc raises on purpose."""


class ConfigError(PpcError):
    """Invalid configuration. ``path`` names the field, e.g. ``plugins[1].parameters.speculativeTTL``."""

    def __init__(self, path: str, message: str) -> None:
        self.path = path
        self.message = message
        super().__init__(f"{path}: {message}" if path else message)


class BindError(PpcError):
    """A socket the service (or a mock engine) listens on cannot be bound. ``flag`` names the
    command-line option that chose the address, ``address`` is ``host:port`` or a ZMQ endpoint."""

    def __init__(self, flag: str, address: str, reason: str) -> None:
        self.flag = flag
        self.address = address
        self.reason = reason
        super().__init__(f"{flag}: cannot listen on {address}: {reason}")

    @classmethod
    def classify(cls, exc: OSError, host: str, port: int, *, host_flag: str, port_flag: str) -> BindError:
        """Blame the host flag when the address does not exist here, the port flag otherwise."""
        bad_host = isinstance(exc, socket.gaierror) or exc.errno == errno.EADDRNOTAVAIL
        # aiohttp re-raises with a long message of its own: the errno's text is the reason.
        reason = exc.strerror if bad_host or not exc.errno else os.strerror(exc.errno)
        reason = reason or str(exc)
        if exc.errno == errno.EADDRINUSE:
            reason = f"port {port} is already in use"
        elif exc.errno == errno.EACCES:
            reason = f"not allowed to bind port {port}"
        shown_host = f"[{host}]" if ":" in host and not host.startswith("[") else host
        return cls(host_flag if bad_host else port_flag, f"{shown_host}:{port}", reason)


class RequestError(PpcError):
    """A request the service answers with an HTTP error instead of routing it."""

    status: int = 500
    error_class: str = "Internal"
    #: Value of the ``x-llm-d-request-dropped-reason`` header, if any.
    dropped_reason: str | None = None

    def __init__(self, message: str) -> None:
        self.message = message
        super().__init__(message)


class BadRequestError(RequestError):
    """The body is not JSON, lacks ``model``, or carries invalid token ids (400)."""

    status = 400
    error_class = "BadRequest"


class PayloadTooLargeError(RequestError):
    """The request body exceeds the configured limit (413)."""

    status = 413
    error_class = "PayloadTooLarge"


class SaturatedError(RequestError):
    """Filters left no endpoint to pick (429)."""

    status = 429
    error_class = "ResourceExhausted"
    dropped_reason = "rejected-saturated"


class SchedulingError(RequestError):
    """The scheduling cycle produced no target (llm-d maps untyped scheduler errors to 429)."""

    status = 429
    error_class = "ResourceExhausted"


class ProtocolConfigError(RequestError):
    """Envoy's ``protocol_config`` names a processing mode this service does not implement: a
    gateway misconfiguration, answered with a 500 that says which field (not a gRPC error)."""

    status = 500
    error_class = "Internal"


class NoEndpointsError(RequestError):
    """No ready endpoint is a candidate for this request (503)."""

    status = 503
    error_class = "ServiceUnavailable"
    dropped_reason = "rejected-no-endpoints"


class WireError(PpcError):
    """A KV-event frame, batch or event that does not follow the wire format. ``reason`` is a metric label."""

    def __init__(self, reason: str, message: str) -> None:
        self.reason = reason
        super().__init__(message)
