"""``metrics-data-source``'s parameters (llm-d's names and defaults) and the polling options they
decode to; see ``metrics_data_source`` for what they do."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ppc_extproc.errors import ConfigError
from ppc_extproc.framework.params import Section, decode, param

__all__ = ["BASE_TICK_SECONDS", "MetricsSourceConfig", "PollOptions", "poll_options", "round_interval"]

#: llm-d's ``--refresh-metrics-interval`` default and minimum.
BASE_TICK_SECONDS = 0.05


@dataclass(frozen=True, slots=True)
class PollOptions:
    """How the source polls."""

    interval_seconds: float = BASE_TICK_SECONDS
    #: Adaptive polling: an endpoint whose load does not change backs off up to this interval;
    #: None (or ≤ ``interval_seconds``) polls at the fixed interval.
    max_interval_seconds: float | None = None
    #: Per poll, connect to end of body (llm-d bounds a poll by 1 s).
    timeout_seconds: float = 0.5
    #: Polls in flight at once, over all endpoints.
    max_concurrency: int = 16
    #: Upper bound of the retry delay of a failing endpoint.
    max_backoff_seconds: float = 1.0
    scheme: str = "http"
    path: str = "/metrics"
    #: None ⇒ the endpoint's own port (vLLM serves /metrics next to the API).
    port: int | None = None
    #: Larger bodies are a failure.
    max_body_bytes: int = 16 * 1024 * 1024
    insecure_skip_verify: bool = True
    ca_cert_path: str = ""
    client_cert_path: str = ""
    client_key_path: str = ""

    def __post_init__(self) -> None:
        for name, value in (("interval_seconds", self.interval_seconds), ("timeout_seconds", self.timeout_seconds),
                            ("max_backoff_seconds", self.max_backoff_seconds)):  # fmt: skip
            if not value > 0:
                raise ValueError(f"{name} must be > 0")
        if self.max_concurrency < 1:
            raise ValueError("max_concurrency must be >= 1")


@dataclass(frozen=True, slots=True)
class MetricsSourceConfig:
    """The source's parameters as written (``poll_options`` checks and rounds them)."""

    scheme: str = param("scheme", "http", choices=("http", "https"))
    path: str = param("path", "/metrics")
    port: int = param("port", 0)
    insecure_skip_verify: bool = param("insecureSkipVerify", True)
    ca_cert_path: str = param("caCertPath", "")
    client_cert_path: str = param("clientCertPath", "")
    client_key_path: str = param("clientKeyPath", "")
    interval_seconds: float = param("interval", "50ms", duration=True)
    max_interval_seconds: float = param("maxInterval", "1s", duration=True)


def round_interval(seconds: float) -> float:
    """llm-d rounds the interval to a multiple of the base tick, at least one tick."""
    ticks = max(1, math.ceil(seconds / BASE_TICK_SECONDS - 1e-9))
    return ticks * BASE_TICK_SECONDS


def poll_options(params: Section) -> PollOptions:
    """Decode and check the parameters; errors name the field."""
    config = decode(params, MetricsSourceConfig)
    if params.has("port") and not 1 <= config.port <= 65535:
        raise ConfigError(params.child_path("port"), f"invalid port {config.port}: must be between 1 and 65535")
    if bool(config.client_cert_path) != bool(config.client_key_path):
        raise ConfigError(params.child_path("clientCertPath"), "clientCertPath and clientKeyPath go together")
    if config.interval_seconds <= 0:
        raise ConfigError(params.child_path("interval"), "must be positive")
    if config.max_interval_seconds < 0:
        raise ConfigError(params.child_path("maxInterval"), "must not be negative")
    interval = round_interval(config.interval_seconds)
    return PollOptions(
        interval_seconds=interval,
        max_interval_seconds=config.max_interval_seconds if config.max_interval_seconds > interval else None,
        scheme=config.scheme,
        path=config.path or "/metrics",
        port=config.port or None,
        insecure_skip_verify=config.insecure_skip_verify,
        ca_cert_path=config.ca_cert_path,
        client_cert_path=config.client_cert_path,
        client_key_path=config.client_key_path,
    )
