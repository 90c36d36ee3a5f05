"""The CLIs against real sockets: a busy port or an address this host lacks is one line naming
the flag and the port (exit 2, no traceback); SIGHUP is ignored (logged), never the end."""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any

import pytest

pytestmark = pytest.mark.integration

#: TEST-NET-1 (RFC 5737): never an address of this host.
ABSENT = "192.0.2.1"


@contextmanager
def busy_port() -> Iterator[int]:
    """A port some other socket is listening on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def run_cli(*argv: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run([sys.executable, "-m", "ppc_extproc", *argv], capture_output=True, text=True,
                              timeout=60, stdin=subprocess.DEVNULL)  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{argv} kept running: {exc.stderr!r}")


def the_one_line(proc: subprocess.CompletedProcess[str], *texts: str) -> None:
    """Exit 2 with one line on stderr (besides JSON log lines) containing ``texts``."""
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip() and not line.startswith("{")]
    assert len(lines) == 1, proc.stderr
    for text in texts:
        assert text in lines[0], lines[0]


SERVE = ["serve", "--endpoints", "127.0.0.1:1", "--log-level", "error"]


def test_serve_busy_grpc_port() -> None:
    with busy_port() as port:
        the_one_line(run_cli(*SERVE, "--grpc-address", "127.0.0.1", "--grpc-port", str(port), "--admin-port", "0"),
                     "--grpc-port", str(port), "in use")  # fmt: skip


def test_serve_busy_admin_port() -> None:
    with busy_port() as port:
        the_one_line(run_cli(*SERVE, "--grpc-port", "0", "--admin-port", str(port)), "--admin-port", str(port), "in use")


def test_serve_addresses_this_host_lacks() -> None:
    the_one_line(run_cli(*SERVE, "--grpc-address", ABSENT, "--grpc-port", "0", "--admin-port", "-1"),
                 "--grpc-address", ABSENT)  # fmt: skip
    the_one_line(run_cli(*SERVE, "--grpc-port", "0", "--admin-address", ABSENT, "--admin-port", "0"),
                 "--admin-address", ABSENT)  # fmt: skip


MOCK = ["mock-vllm", "--log-level", "error"]


def test_mock_busy_http_port_and_absent_host() -> None:
    with busy_port() as port:
        the_one_line(run_cli(*MOCK, "--port", str(port), "--kv-events-endpoint", ""), "--port", str(port), "in use")
    the_one_line(run_cli(*MOCK, "--host", ABSENT, "--port", "0", "--kv-events-endpoint", ""), "--host", ABSENT)


def test_mock_busy_kv_event_and_replay_ports() -> None:
    with busy_port() as port:
        the_one_line(run_cli(*MOCK, "--port", "0", "--kv-events-endpoint", f"tcp://127.0.0.1:{port}"),
                     "--kv-events-endpoint", str(port))  # fmt: skip
        the_one_line(run_cli(*MOCK, "--port", "0", "--kv-events-endpoint", "tcp://127.0.0.1:0",
                             "--replay-endpoint", f"tcp://127.0.0.1:{port}"),
                     "--replay-endpoint", str(port))  # fmt: skip


class Lines:
    """A process stream read on a thread, so waits can time out."""

    def __init__(self, stream: IO[str]) -> None:
        self._q: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []

        def pump() -> None:
            for line in stream:
                self._q.put(line)
            self._q.put(None)

        threading.Thread(target=pump, daemon=True).start()

    def wait_for(self, text: str, timeout: float = 60.0) -> str:
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self._q.get(timeout=left)
            except queue.Empty:
                break
            if line is None:
                pytest.fail(f"stream ended before {text!r}: {''.join(self.seen)[-2000:]}")
            self.seen.append(line)
            if text in line:
                return line
        pytest.fail(f"no {text!r} within {timeout} s: {''.join(self.seen)[-2000:]}")


def get(url: str) -> int:
    with urllib.request.urlopen(url, timeout=10) as r:
        return int(r.status)


@contextmanager
def process(*argv: str) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen([sys.executable, "-m", "ppc_extproc", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, start_new_session=True)  # fmt: skip
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=20)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def test_serve_ignores_sighup() -> None:
    with process("serve", "--endpoints", "127.0.0.1:1", "--grpc-port", "0", "--admin-port", "0",
                 "--log-format", "json") as proc:  # fmt: skip
        assert proc.stderr is not None
        err = Lines(proc.stderr)
        ready: dict[str, Any] = json.loads(err.wait_for("service_ready"))
        proc.send_signal(signal.SIGHUP)
        err.wait_for("sighup_ignored")
        assert proc.poll() is None
        assert get(f"http://127.0.0.1:{ready['admin_port']}/readyz") == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0


def test_mock_vllm_ignores_sighup() -> None:
    with process("mock-vllm", "--port", "0", "--kv-events-endpoint", "tcp://127.0.0.1:0", "--log-level", "info") as proc:
        assert proc.stdout is not None and proc.stderr is not None
        engine = json.loads(Lines(proc.stdout).wait_for("mock_vllm_ready"))["engines"][0]
        err = Lines(proc.stderr)
        proc.send_signal(signal.SIGHUP)
        err.wait_for("sighup_ignored")
        assert get(f"{engine['url']}/health") == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
