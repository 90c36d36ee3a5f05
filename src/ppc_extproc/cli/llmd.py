"""llm-d's EPP flags on ``serve``, so the image takes the argument list llm-d's chart renders.

Every flag of ``llm-d/llm-d-router: pkg/epp/server/options.go`` (plus the zap and ``-v`` logging
flags of ``pkg/common/observability/logging/options.go``) is accepted in pflag's forms
(``--flag``, ``--flag=true|false``, ``--flag value``, ``--flag=value``). Each is either
implemented or, when set, logged once at startup as having no effect (``llmd_flag_no_effect``).

``ppc-extproc --pool-name … --zap-encoder json …`` (arguments that start with a flag, the chart's
form) means ``ppc-extproc serve --llm-d-defaults …``: the defaults of the flags both programs share
become llm-d's (health port 9003, metrics on every interface, 30 s drain, TLS on ext_proc).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

__all__ = [
    "LLMD_DEFAULTS_FLAG",
    "LlmdFlagError",
    "LlmdSettings",
    "add_llmd_flags",
    "chart_argv",
    "fail",
    "log_llmd_settings",
    "parse_duration",
    "parse_go_bool",
    "parse_quantity",
    "resolve",
]

LLMD_DEFAULTS_FLAG = "--llm-d-defaults"

#: llm-d's defaults (options.go ``NewOptions``) for what differs from ``serve``'s own defaults.
DEFAULT_HEALTH_PORT = 9003
DEFAULT_DRAIN_TIMEOUT_SECONDS = 30.0

_TOP_LEVEL_FLAGS = frozenset({"-h", "--help", "--version"})


def chart_argv(argv: list[str]) -> list[str]:
    """``argv`` as ``serve`` sees it: a leading ``--flag`` (the chart gives ``args:`` only, no
    command) means ``serve --llm-d-defaults``; anything else is returned unchanged."""
    if argv and argv[0].startswith("-") and argv[0].split("=", 1)[0] not in _TOP_LEVEL_FLAGS:
        return ["serve", LLMD_DEFAULTS_FLAG, *argv]
    return argv


# ---- value parsers (pflag's and Kubernetes' grammars) --------------------------------------------

_GO_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_GO_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})


def parse_go_bool(text: str) -> bool:
    """Go's ``strconv.ParseBool``, which pflag's bool flags use."""
    if text in _GO_TRUE:
        return True
    if text in _GO_FALSE:
        return False
    raise argparse.ArgumentTypeError(f"invalid boolean {text!r} (true or false)")


_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


def parse_duration(text: str) -> float:
    """Go's ``time.ParseDuration`` (``30s``, ``1m30s``, ``500ms``, ``0``) in seconds; negative
    durations are refused (no llm-d duration flag means anything by one)."""
    if text == "0":
        return 0.0
    pos, total = 0, 0.0
    while pos < len(text):
        match = _DURATION_PART.match(text, pos)
        if match is None:
            raise argparse.ArgumentTypeError(f"invalid duration {text!r} (e.g. 30s, 1m30s, 500ms)")
        total += float(match.group(1)) * _DURATION_UNITS[match.group(2)]
        pos = match.end()
    if not text:
        raise argparse.ArgumentTypeError("invalid duration '' (e.g. 30s, 1m30s, 500ms)")
    return total


_QUANTITY = re.compile(r"([+-]?(?:\d+(?:\.\d*)?|\.\d+))(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E|m|[eE][+-]?\d+)?")
_SUFFIX = {
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
    "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
}


def parse_quantity(text: str) -> int:
    """A byte count as llm-d reads ``--grpc-max-*-msg-size``: a trailing ``B``/``b`` dropped, then a
    Kubernetes quantity (``10MiB`` → 10485760, ``25MB`` → 25000000, ``4194304``)."""
    s = text.strip()
    if len(s) > 1 and s[-1] in "Bb":
        s = s[:-1]
    match = _QUANTITY.fullmatch(s)
    if match is None:
        raise argparse.ArgumentTypeError(f"invalid size {text!r} (e.g. 10MiB, 25MB, 4194304)")
    try:
        number = Decimal(match.group(1))
    except InvalidOperation:
        raise argparse.ArgumentTypeError(f"invalid size {text!r}") from None
    suffix = match.group(2) or ""
    if suffix == "m":
        value = number / 1000
    elif suffix[:1] in ("e", "E"):
        value = number * (Decimal(10) ** int(suffix[1:]))
    else:
        value = number * _SUFFIX.get(suffix, 1)
    if value != value.to_integral_value():
        raise argparse.ArgumentTypeError(f"size {text!r} is not a whole number of bytes")
    if value < 0:
        raise argparse.ArgumentTypeError(f"size {text!r} must be non-negative")
    if value > 2**31 - 1:  # gRPC's message limits are C ints
        raise argparse.ArgumentTypeError(f"size {text!r} exceeds 2 GiB")
    return int(value)


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid port {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port {value} is outside [0, 65535]")
    return value


# ---- the flags -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Flag:
    name: str
    kind: str  # bool | int | port | str | duration | quantity
    help: str
    #: Why the flag has no effect here (logged when it is set); None when it is implemented.
    no_effect: str | None = None
    choices: tuple[str, ...] | None = None


_NOT_PPC = "not implemented by ppc-extproc"
_ENGINE_METRIC = "deprecated in llm-d; engine metric names are set per engine in the config's data layer"

#: llm-d's flags that ``serve`` does not already have under the same name. Shared ones
#: (--grpc-port, --config-file, --pool-*, --endpoint-*) are defined once, by ``serve``.
_FLAGS: tuple[_Flag, ...] = (
    _Flag("grpc-health-port", "port", "gRPC health server port, services liveness, readiness, "
          "inference-extension and '' (llm-d default 9003; plain serve: none)"),
    _Flag("metrics-port", "port", "Prometheus /metrics port: the admin port (--admin-port)"),
    _Flag("config-text", "str", "the EndpointPickerConfig as text, instead of --config-file"),
    _Flag("drain-timeout", "duration", "after SIGTERM: readiness NOT_SERVING while ext_proc keeps "
          "serving this long (llm-d default 30s; plain serve: 0)"),
    _Flag("grpc-max-recv-msg-size", "quantity", "largest gRPC message received, e.g. 10MiB, 25MB"),
    _Flag("grpc-max-send-msg-size", "quantity", "largest gRPC message sent, e.g. 10MiB, 25MB"),
    _Flag("disable-endpoint-subset-filter", "bool", "ignore Envoy's envoy.lb.subset_hint endpoint subset"),
    _Flag("health-checking", "bool", "gRPC health on the ext_proc port (always on here)"),
    _Flag("cert-path", "str", "directory with tls.crt and tls.key: serve ext_proc over TLS"),
    _Flag("zap-encoder", "str", "log format: json or console (= --log-format)", choices=("json", "console")),
    _Flag("zap-log-level", "str", "log level: debug, info, warn, error (or a verbosity number)"),
    _Flag("zap-devel", "bool", "development logging: console format, debug level"),
    _Flag("zap-stacktrace-level", "str", "zap stack trace level", no_effect="stack traces go with errors"),
    _Flag("zap-time-encoding", "str", "zap time encoding", no_effect="timestamps are ISO 8601 UTC"),
    _Flag("ha-enable-leader-election", "bool", "leader election on the Lease epp-<namespace>-<pool>.llm-d.ai: "
          "only the leader is ready (health port readiness)"),
    _Flag("secure-serving", "bool", "TLS on the ext_proc port, with a self-signed certificate made at start "
          "unless --cert-path (llm-d default true; plain serve: false)"),
    _Flag("enable-cert-reload", "bool", "re-read --cert-path (or --tls-cert-file/--tls-key-file) when the files "
          "change: new connections get the new certificate"),
    _Flag("tracing", "bool", "OpenTelemetry spans of the request path, OTLP from OTEL_* (llm-d default true; "
          "plain serve: off; needs ppc-extproc[tracing])"),
    _Flag("metrics-endpoint-auth", "bool", "TokenReview + SubjectAccessReview (get /metrics) of the bearer token "
          "on /metrics (llm-d default true; plain serve: off)"),
    _Flag("metrics-client-ca-file", "str", "metrics mTLS client CA", no_effect="the metrics port is plain HTTP"),
    _Flag("metrics-cert-dir", "str", "metrics TLS certificates", no_effect="the metrics port is plain HTTP"),
    _Flag("enable-pprof", "bool", "pprof handlers", no_effect="no pprof in Python; see /debug/state on the admin port"),
    _Flag("enable-grpc-stream-metrics", "bool", "ext_proc stream metrics", no_effect=_NOT_PPC),
    _Flag("allow-experimental-plugins", "bool", "allow alpha plugins", no_effect="no plugin is gated as experimental"),
    _Flag("refresh-metrics-interval", "duration", "engine metrics scrape interval",
          no_effect="set the metrics data source's interval in the config"),
    _Flag("refresh-prometheus-metrics-interval", "duration", "flush interval of pool gauges",
          no_effect="pool gauges are read at scrape time"),
    _Flag("metrics-staleness-threshold", "duration", "engine metrics staleness",
          no_effect="set staleness in the config's data layer"),
    _Flag("total-queued-requests-metric", "str", "engine metric", no_effect=_ENGINE_METRIC),
    _Flag("total-running-requests-metric", "str", "engine metric", no_effect=_ENGINE_METRIC),
    _Flag("kv-cache-usage-percentage-metric", "str", "engine metric", no_effect=_ENGINE_METRIC),
    _Flag("lora-info-metric", "str", "engine metric", no_effect=_ENGINE_METRIC),
    _Flag("cache-info-metric", "str", "engine metric", no_effect=_ENGINE_METRIC),
)

#: Booleans whose value, not just presence, decides whether the no-effect warning applies: a flag
#: turning off a feature we lack anyway is accurate as given.
_WARN_WHEN_TRUE = frozenset({
    "ha-enable-leader-election", "secure-serving", "tracing", "metrics-endpoint-auth",
    "enable-pprof", "enable-grpc-stream-metrics", "allow-experimental-plugins",
})

#: llm-d's defaults for flags whose absence a drop-in must still honour (options.go NewOptions).
_LLMD_TRUE_DEFAULTS: tuple[str, ...] = ()

_TYPES: dict[str, Callable[[str], Any]] = {"bool": parse_go_bool, "int": int, "port": _port, "str": str, "duration": parse_duration,
          "quantity": parse_quantity}


def _dest(name: str) -> str:
    return "llmd_" + name.replace("-", "_")


def add_llmd_flags(parser: argparse.ArgumentParser) -> None:
    """Add llm-d's EPP flags to ``serve`` as one help group."""
    parser.add_argument(LLMD_DEFAULTS_FLAG, action="store_true", dest="llmd_defaults",
                        help="llm-d's defaults: health port 9003, metrics on 0.0.0.0 (no /debug), 30s drain, "
                        "TLS on ext_proc (self-signed unless --cert-path); "
                        "implied when the arguments start with a --flag (llm-d's chart form)")
    group = parser.add_argument_group(
        "llm-d EPP flags (llm-d-router pkg/epp/server/options.go; --grpc-port, --config-file, --pool-* and "
        "--endpoint-* above are shared)")
    for flag in _FLAGS:
        help_text = flag.help + (f" [no effect: {flag.no_effect}]" if flag.no_effect else "")
        if flag.kind == "bool":
            group.add_argument(f"--{flag.name}", dest=_dest(flag.name), nargs="?", const=True, default=None,
                               type=parse_go_bool, metavar="true|false", help=help_text)
        else:
            group.add_argument(f"--{flag.name}", dest=_dest(flag.name), default=None, type=_TYPES[flag.kind],
                               choices=flag.choices, metavar=flag.kind.upper(), help=help_text)
    group.add_argument("-v", "--v", dest="llmd_v", type=int, default=None, metavar="N",
                       help="log verbosity: 4 and above log at debug (llm-d's DEBUG=4)")


@dataclass
class LlmdSettings:
    """What llm-d's flags resolve to, for ``ServeOptions`` and logging."""

    grpc_health_port: int | None = None
    admin_port: int | None = None
    admin_address: str | None = None
    admin_debug: bool = True
    config_text: str | None = None
    drain_timeout_seconds: float = 0.0
    grpc_max_recv_bytes: int | None = None
    grpc_max_send_bytes: int | None = None
    honour_subset: bool = True
    leader_election: bool = False
    metrics_auth: bool = False
    tracing: bool = False
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    tls_self_signed: bool = False
    tls_cert_reload: bool = False
    log_format: str | None = None
    log_level: str | None = None
    pod_name: str | None = None
    #: (flag, reason) for each flag set with no effect, logged once each at startup.
    no_effect: list[tuple[str, str]] = field(default_factory=list)

    def serve_options(self) -> dict[str, Any]:
        """The ``ServeOptions`` fields these settings decide."""
        return {
            "config_text": self.config_text, "health_port": self.grpc_health_port,
            "leader_election": self.leader_election, "drain_timeout_seconds": self.drain_timeout_seconds,
            "grpc_max_recv_bytes": self.grpc_max_recv_bytes, "grpc_max_send_bytes": self.grpc_max_send_bytes,
            "admin_debug": self.admin_debug, "honour_subset": self.honour_subset,
            "tls_self_signed": self.tls_self_signed, "tls_cert_reload": self.tls_cert_reload,
        }


def log_llmd_settings(settings: LlmdSettings) -> None:
    """Log, once each, the llm-d flags that have no effect; bind ``POD_NAME`` to every log event."""
    import structlog

    if settings.pod_name:
        structlog.contextvars.bind_contextvars(pod=settings.pod_name)
    log = structlog.get_logger(__name__)
    for name, reason in settings.no_effect:
        log.warning("llmd_flag_no_effect", flag=f"--{name}", reason=reason)


class LlmdFlagError(ValueError):
    """A combination of llm-d flags that llm-d itself refuses; the message names the flag."""


def _zap_level(text: str) -> str:
    level = text.strip().lower()
    if level.isdigit():  # a verbosity, as zap's flag takes it
        return "debug" if int(level) >= 4 else "info"
    mapping = {"debug": "debug", "info": "info", "warn": "warning", "error": "error",
               "dpanic": "error", "panic": "error", "fatal": "error"}
    if level not in mapping:
        raise LlmdFlagError(f"--zap-log-level: invalid level {text!r} (debug, info, warn, error or a number)")
    return mapping[level]


def resolve(args: argparse.Namespace, env: dict[str, str] | None = None) -> LlmdSettings:
    """Resolve llm-d's flags (and ``POD_NAME``) into settings; raises ``LlmdFlagError``."""
    env = dict(os.environ) if env is None else env

    def get(name: str) -> Any:
        return getattr(args, _dest(name))

    chart = bool(args.llmd_defaults)
    out = LlmdSettings(pod_name=env.get("POD_NAME") or None)
    if get("config-text") is not None and args.config_file is not None:
        raise LlmdFlagError("both the --config-file and --config-text flags cannot be set at the same time")
    out.config_text = get("config-text")
    out.grpc_health_port = get("grpc-health-port")
    if out.grpc_health_port is None and chart:
        out.grpc_health_port = DEFAULT_HEALTH_PORT
    out.admin_port = get("metrics-port")
    if chart:
        # Prometheus scrapes the pod IP; /debug stays off a port reachable from outside the pod.
        out.admin_address, out.admin_debug = "0.0.0.0", False
    drain = get("drain-timeout")
    out.drain_timeout_seconds = drain if drain is not None else (DEFAULT_DRAIN_TIMEOUT_SECONDS if chart else 0.0)
    out.grpc_max_recv_bytes = get("grpc-max-recv-msg-size") or None
    out.grpc_max_send_bytes = get("grpc-max-send-msg-size") or None
    out.honour_subset = not get("disable-endpoint-subset-filter")
    out.leader_election = bool(get("ha-enable-leader-election"))
    auth = get("metrics-endpoint-auth")
    out.metrics_auth = bool(chart if auth is None else auth)  # llm-d's default true in the chart form
    tracing = get("tracing")
    out.tracing = bool(chart if tracing is None else tracing)
    cert_path = get("cert-path")
    secure = get("secure-serving")
    if secure is None:
        secure = chart  # llm-d serves TLS by default; plain serve stays plaintext
    if secure and cert_path is not None:
        out.tls_cert_file, out.tls_key_file = str(Path(cert_path) / "tls.crt"), str(Path(cert_path) / "tls.key")
    out.tls_self_signed = bool(secure) and cert_path is None
    if get("enable-cert-reload"):
        if out.tls_cert_file is None and getattr(args, "tls_cert_file", None) is None:
            out.no_effect.append(("enable-cert-reload", "no certificate files to reload (--cert-path unset)"))
        else:
            out.tls_cert_reload = True

    if get("zap-devel"):
        out.log_format, out.log_level = "console", "debug"
    if get("zap-encoder") is not None:
        out.log_format = get("zap-encoder")
    if args.llmd_v is not None:
        out.log_level = "debug" if args.llmd_v >= 4 else "info"
    if get("zap-log-level") is not None:
        out.log_level = _zap_level(get("zap-log-level"))

    for flag in _FLAGS:
        if flag.no_effect is None:
            continue
        value = get(flag.name)
        if value is None and chart and flag.name in _LLMD_TRUE_DEFAULTS:
            value = True  # llm-d's default, which a drop-in is expected to honour
        if value is None or (flag.name in _WARN_WHEN_TRUE and value is False):
            continue
        out.no_effect.append((flag.name, flag.no_effect))
    return out


def fail(message: str) -> int:
    """Print a one-line usage error for ``serve`` and return its exit status."""
    print(f"ppc-extproc serve: {message}", file=sys.stderr)
    return 2
