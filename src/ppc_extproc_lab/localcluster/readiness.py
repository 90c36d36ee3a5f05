"""Readiness waits: poll a condition with short, growing waits until a deadline.

Each wait fails at once when the watched :class:`ManagedProcess` exits, and its
:class:`ReadinessError` names what was awaited, the last error seen and the tail of the process
log. Probes go to loopback addresses directly (environment proxies are ignored).
"""

from __future__ import annotations

import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from ppc_extproc_lab.localcluster._errors import ReadinessError

__all__ = ["WatchedProcess", "http_status", "wait_for", "wait_for_grpc_health", "wait_for_http", "wait_for_tcp"]


class WatchedProcess(Protocol):
    """What a wait needs of the process it watches (``processes.ManagedProcess``)."""

    name: str
    log_path: Path

    @property
    def returncode(self) -> int | None: ...

    def running(self) -> bool: ...

    def log_tail(self, lines: int = 40) -> str: ...


def wait_for(
    check: Callable[[], bool],
    *,
    what: str,
    timeout: float = 30.0,
    process: WatchedProcess | None = None,
    detail: Callable[[], str] | None = None,
) -> None:
    """Poll ``check()`` (short, growing waits) until it returns True or ``timeout`` passes.

    Raises :class:`ReadinessError` on timeout, or at once when ``process`` exits; the message
    names ``what``, adds ``detail()`` (e.g. the last error) and the tail of the process log.
    """
    deadline = time.monotonic() + timeout
    pause = 0.01
    while True:
        if check():
            return
        if process is not None and not process.running():
            raise ReadinessError(
                _failure(
                    f"{process.name} exited with status {process.returncode} before {what}",
                    process,
                    detail,
                )
            )
        now = time.monotonic()
        if now >= deadline:
            raise ReadinessError(
                _failure(f"timed out after {timeout:g}s waiting for {what}", process, detail)
            )
        time.sleep(min(pause, deadline - now))
        pause = min(pause * 1.5, 0.2)


def _failure(message: str, process: WatchedProcess | None, detail: Callable[[], str] | None) -> str:
    parts = [message]
    if detail is not None and (d := detail()):
        parts.append(f"last error: {d}")
    if process is not None:
        parts.append(f"--- last lines of {process.log_path} ---\n{process.log_tail()}")
    return "\n".join(parts)


def wait_for_tcp(
    host: str, port: int, *, timeout: float = 30.0, process: WatchedProcess | None = None
) -> None:
    """Wait until ``host:port`` accepts TCP connections."""
    last = [""]

    def check() -> bool:
        try:
            with socket.create_connection((host.strip("[]"), port), timeout=1.0):
                return True
        except OSError as exc:
            last[0] = str(exc)
            return False

    wait_for(
        check, what=f"tcp {host}:{port}", timeout=timeout, process=process, detail=lambda: last[0]
    )


# Readiness probes go to loopback addresses: never through an http_proxy from the environment.
_NO_PROXY_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http_status(url: str, *, timeout: float = 2.0) -> int:
    """Status code of ``GET url`` (no proxies, no redirects followed beyond urllib's default)."""
    try:
        with _NO_PROXY_OPENER.open(url, timeout=timeout) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def wait_for_http(
    url: str,
    *,
    expect_status: int = 200,
    timeout: float = 30.0,
    process: WatchedProcess | None = None,
) -> None:
    """Wait until ``GET url`` answers ``expect_status``."""
    last = [""]

    def check() -> bool:
        try:
            status = http_status(url)
        except (OSError, ValueError) as exc:
            last[0] = str(exc)
            return False
        last[0] = f"status {status}"
        return status == expect_status

    wait_for(
        check,
        what=f"GET {url} -> {expect_status}",
        timeout=timeout,
        process=process,
        detail=lambda: last[0],
    )


def wait_for_grpc_health(
    target: str,
    service: str = "",
    *,
    timeout: float = 30.0,
    process: WatchedProcess | None = None,
    tls: bool = False,
) -> None:
    """Wait until ``grpc.health.v1.Health/Check(service)`` at ``target`` (``host:port``) is SERVING.

    ``tls``: the port serves TLS; the probe trusts whatever certificate it presents (as llm-d's
    gateways do a self-signed one) and checks the name ``localhost``.
    """
    import ssl

    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    options: list[tuple[str, Any]] = [
        ("grpc.enable_http_proxy", 0),
        ("grpc.initial_reconnect_backoff_ms", 50),
        ("grpc.min_reconnect_backoff_ms", 50),
        ("grpc.max_reconnect_backoff_ms", 250),
    ]
    last = [""]
    channels: list[grpc.Channel] = []

    def channel() -> grpc.Channel | None:
        if channels:
            return channels[0]
        if not tls:
            channels.append(grpc.insecure_channel(target, options=options))
            return channels[0]
        host, _, port = target.rpartition(":")
        try:
            pem = ssl.get_server_certificate((host.strip("[]"), int(port)), timeout=1.0)
        except OSError as exc:
            last[0] = f"TLS handshake: {exc}"
            return None
        credentials = grpc.ssl_channel_credentials(root_certificates=pem.encode())
        channels.append(grpc.secure_channel(
            target, credentials, options=[*options, ("grpc.ssl_target_name_override", "localhost")]))
        return channels[0]

    def check() -> bool:
        ch = channel()
        if ch is None:
            return False
        try:
            resp = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=service), timeout=1.0)
        except grpc.RpcError as exc:
            last[0] = f"{exc.code().name}: {exc.details()}"
            return False
        last[0] = health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)
        return bool(resp.status == health_pb2.HealthCheckResponse.SERVING)

    try:
        wait_for(
            check,
            what=f"gRPC health {service or '(server)'!s} SERVING at {target}" + (" (TLS)" if tls else ""),
            timeout=timeout,
            process=process,
            detail=lambda: last[0],
        )
    finally:
        for ch in channels:
            ch.close()
