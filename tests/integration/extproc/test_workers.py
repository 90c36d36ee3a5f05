"""``serve --workers N``: N service processes share the gRPC port (SO_REUSEPORT), each with its
own admin port; SIGTERM drains them all; a worker that dies takes the service down."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from harness import BUFFERED, Client, body, headers, response_headers

from ppc_extproc.server.workers import worker_argv
from ppc_extproc_lab.localcluster import free_port, is_port_free, wait_for

pytestmark = pytest.mark.integration

PODS = "192.168.1.1:8000,192.168.1.2:8000"
ROUTED = 'ppc_extproc_requests_total{code="200",outcome="routed"} '


def _two_free_ports() -> int:
    for _ in range(100):
        port = free_port()
        if port < 65535 and is_port_free("127.0.0.1", port + 1):
            return port
    raise RuntimeError("no two consecutive free ports")


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, ""
    except OSError:
        return 0, ""


def _routed(admin: int) -> float:
    _, text = _get(f"http://127.0.0.1:{admin}/metrics")
    return next((float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(ROUTED)), 0.0)


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(p) for p in f.read().split()]


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], int, int]]:
    grpc_port, admin = free_port(), _two_free_ports()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3] / "src")}
    process = subprocess.Popen(
        [sys.executable, "-m", "ppc_extproc", "serve", "--workers", "2", "--grpc-port", str(grpc_port),
         "--admin-port", str(admin), "--endpoints", PODS, "--log-level", "warning"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, start_new_session=True,
    )  # fmt: skip
    try:
        for port in (admin, admin + 1):
            wait_for(lambda port=port: _get(f"http://127.0.0.1:{port}/readyz")[0] == 200,
                     what=f"worker on admin port {port} to be ready", timeout=60)  # fmt: skip
        yield process, grpc_port, admin
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)


def _route_one(grpc_port: int) -> None:
    client = Client(grpc_port)  # a new channel: a new connection, which the kernel may give either worker
    try:
        data = orjson.dumps({"model": "m", "prompt": list(range(100, 164)), "max_tokens": 4})
        replies = client.run([headers(mode=BUFFERED, response_mode=0), body(data), response_headers()])
        assert replies[1].WhichOneof("response") == "request_body"
    finally:
        client.close()


def test_workers_share_the_port_and_drain_on_sigterm(workers: tuple[subprocess.Popen[bytes], int, int]) -> None:
    process, grpc_port, admin = workers
    pids = _children(process.pid)
    assert len(pids) == 2
    sent = 0
    while sent < 200 and not (_routed(admin) > 0 and _routed(admin + 1) > 0):
        _route_one(grpc_port)
        sent += 1
    wait_for(lambda: _routed(admin) + _routed(admin + 1) == sent, what="every request to be counted", timeout=10)
    assert _routed(admin) > 0 and _routed(admin + 1) > 0, "the kernel gave every connection to one worker"
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == 0
    for pid in pids:
        wait_for(lambda pid=pid: not os.path.exists(f"/proc/{pid}") or _zombie(pid), what=f"worker {pid} to exit", timeout=10)


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_a_dead_worker_takes_the_service_down(workers: tuple[subprocess.Popen[bytes], int, int]) -> None:
    process, _, _ = workers
    first, second = _children(process.pid)
    os.kill(first, signal.SIGKILL)
    assert process.wait(timeout=30) != 0
    wait_for(lambda: _zombie(second), what="the other worker to exit", timeout=10)


def test_worker_argv_rewrites_only_the_worker_flags() -> None:
    argv = ["serve", "--workers", "4", "--grpc-port", "9002", "--admin-port=9090", "--endpoints", "a:1"]
    assert worker_argv(argv, 2, 9090) == [
        "serve", "--grpc-port", "9002", "--endpoints", "a:1", "--worker-index", "2", "--admin-port", "9092",
    ]  # fmt: skip
    assert worker_argv(argv, 3, 0)[-2:] == ["--admin-port", "0"]
