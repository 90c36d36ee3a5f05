"""``python -m ppc_extproc_lab.mock_vllm`` as a process: ready line, serving, clean SIGTERM exit."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration

SRC = Path(__file__).resolve().parents[2] / "src"


def _read_ready_line(proc: subprocess.Popen[bytes], timeout: float) -> dict[str, Any]:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    buf = b""
    while b"\n" not in buf:
        remaining = deadline - time.monotonic()
        assert remaining > 0, "no ready line from mock-vllm"
        ready, _, _ = select.select([proc.stdout], [], [], remaining)
        if ready:
            chunk = os.read(proc.stdout.fileno(), 4096)
            assert chunk, f"mock-vllm exited early with {proc.poll()}"
            buf += chunk
    line: dict[str, Any] = json.loads(buf.split(b"\n", 1)[0])
    return line


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_cli_serves_and_exits_cleanly_on_signal(signum: int) -> None:
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    cmd = [
        sys.executable, "-m", "ppc_extproc_lab.mock_vllm",
        "--port", "0", "--count", "2", "--model", "m",
        "--kv-events-endpoint", "tcp://127.0.0.1:0", "--replay-endpoint", "tcp://127.0.0.1:0",
        "--log-level", "warning",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        ready = _read_ready_line(proc, timeout=20)
        assert ready["event"] == "mock_vllm_ready"
        engines = ready["engines"]
        assert len(engines) == 2
        for eng in engines:
            assert eng["topic"] == f"kv@{eng['endpoint']}@m"
            assert eng["kv_events_endpoint"].startswith("tcp://127.0.0.1:")
            with urllib.request.urlopen(f"{eng['url']}/health", timeout=5) as r:
                assert r.status == 200
                assert r.headers["x-mock-vllm-endpoint"] == eng["endpoint"]
            req = urllib.request.Request(
                f"{eng['url']}/v1/completions",
                data=json.dumps({"prompt": list(range(40)), "max_tokens": 2}).encode(),
                headers={"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(req, timeout=5) as r:
                assert json.load(r)["usage"]["completion_tokens"] == 2
        start = time.monotonic()
        proc.send_signal(signum)
        assert proc.wait(timeout=5) == 0
        assert time.monotonic() - start < 2.0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=5)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def test_distinct_hosts_give_each_engine_its_own_address_cache_and_kv_socket() -> None:
    """``--count 3 --distinct-hosts``: engines on 127.0.0.{first..first+2}, the same HTTP and KV
    ports on each (like pods), each with its own cache."""
    from ppc_extproc_lab.localcluster import PortAllocator

    first = 60
    hosts = [f"127.0.0.{first + i}" for i in range(3)]
    http_port, kv_port = PortAllocator().ports(2, hosts)
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    cmd = [
        sys.executable, "-m", "ppc_extproc_lab.mock_vllm", "--host", hosts[0], "--port", str(http_port),
        "--count", "3", "--distinct-hosts", "--kv-events-endpoint", f"tcp://{hosts[0]}:{kv_port}",
        "--block-size", "16", "--log-level", "warning",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        engines = _read_ready_line(proc, timeout=20)["engines"]
        assert [e["endpoint"] for e in engines] == [f"{h}:{http_port}" for h in hosts]
        assert [e["kv_events_endpoint"] for e in engines] == [f"tcp://{h}:{kv_port}" for h in hosts]
        assert [e["topic"] for e in engines] == [f"kv@{h}:{http_port}@mock-model" for h in hosts]
        prompt = list(range(64))

        def complete(url: str) -> int:
            req = urllib.request.Request(f"{url}/v1/completions", headers={"Content-Type": "application/json"},
                                         data=json.dumps({"prompt": prompt, "max_tokens": 1}).encode())  # fmt: skip
            with urllib.request.urlopen(req, timeout=5) as r:
                return int(json.load(r)["usage"]["prompt_tokens_details"]["cached_tokens"])

        assert complete(engines[0]["url"]) == 0
        assert complete(engines[0]["url"]) == 48  # cached there (the last block is always recomputed)
        assert complete(engines[1]["url"]) == 0  # not on its neighbour
    finally:
        proc.kill()
        proc.wait(timeout=5)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
