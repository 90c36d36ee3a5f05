"""``ppc-extproc demo`` end to end: a tiny run through real Envoy, mock engines and the service.

The demo runs as a subprocess with a marker in its environment; every process it starts
inherits the marker, so ``/proc/*/environ`` tells whether any is left behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs /proc"),
]

# 4 tenants × 512-token contexts over 2 engines of 24 blocks × 64 tokens (1,536 tokens): no engine
# can keep every context, so round-robin churns while precise routing keeps two tenants per engine.
TINY = [
    "--engines", "2", "--tenants", "4", "--users-per-tenant", "2", "--context-tokens", "512",
    "--question-tokens", "64", "--output-tokens", "4", "--turns", "2", "--num-blocks", "24",
    "--block-size", "64", "--prefill-tokens-per-s", "20000", "--decode-ms-per-token", "5",
    "--max-num-seqs", "4", "--rate", "12", "--duration", "3", "--drain", "15", "--seed", "1",
]  # fmt: skip


def marked_pids(mark: str) -> list[int]:
    """Processes of this user whose environment carries ``mark``."""
    needle = f"PPC_DEMO_TEST_MARK={mark}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def wait_until_gone(mark: str, timeout: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while (left := marked_pids(mark)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def demo(mark: str, *extra: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PPC_DEMO_TEST_MARK": mark, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "ppc_extproc", "demo", *TINY, *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def test_tiny_demo_table_is_sane_and_leaves_nothing_behind() -> None:
    mark = uuid.uuid4().hex
    proc = demo(mark, "--json", "--check")
    try:
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err[-3000:]
    assert wait_until_gone(mark) == []
    report = json.loads(out)
    results = {r["policy"]: r["summary"] for r in report["results"]}
    assert list(results) == ["precise-prefix", "round-robin"]
    precise, rr = results["precise-prefix"], results["round-robin"]
    for s in (precise, rr):
        assert s["completed"] == s["scheduled"] > 10
        assert s["errors"] == s["unfinished"] == 0
        assert 0 < s["ttft_p50_s"] <= s["ttft_p90_s"]
        assert s["output_tokens_per_s"] > 0
        assert sum(s["requests_per_endpoint"].values()) == s["completed"]
    # Same seeded workload under both policies.
    assert precise["scheduled"] == rr["scheduled"] and precise["prompt_tokens"] == rr["prompt_tokens"]
    # Round-robin alternates engines exactly; prefix-aware routing hits the cache far more often.
    assert max(rr["requests_per_endpoint"].values()) - min(rr["requests_per_endpoint"].values()) <= 1
    assert precise["hit_rate"] > rr["hit_rate"] + 0.15
    assert "precise-prefix" in err and "round-robin" in err  # progress lines on stderr


def test_a_policy_completing_under_90_percent_fails_the_demo() -> None:
    """Prefill far slower than the arrivals and no drain: most requests are cut off unfinished."""
    mark = uuid.uuid4().hex
    proc = demo(mark, "--policies", "round-robin", "--prefill-tokens-per-s", "300", "--drain", "0")
    try:
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 1, err[-3000:]
    assert wait_until_gone(mark) == []
    assert "round-robin" in out  # the table is still printed
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("ppc-extproc demo: round-robin completed ") and "less than 90%" in last


def test_table_output_without_json() -> None:
    mark = uuid.uuid4().hex
    proc = demo(mark, "--policies", "precise,round-robin", "--max-requests", "12")
    try:
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err[-3000:]
    assert wait_until_gone(mark) == []
    lines = out.strip().splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("policy"))
    assert "hit rate" in lines[header] and "TTFT p90 ms" in lines[header]
    assert lines[header + 2].startswith("precise ") and lines[header + 3].startswith("round-robin ")
    assert lines[-1].startswith("precise vs round-robin: hit rate ")


def test_ctrl_c_stops_everything() -> None:
    mark = uuid.uuid4().hex
    proc = demo(mark, "--duration", "60")
    try:
        assert proc.stderr is not None
        deadline = time.monotonic() + 40
        seen = ""
        while "sent" not in seen:  # the first progress line: the cluster is up and running
            assert time.monotonic() < deadline, "demo never started its run"
            line = proc.stderr.readline()
            assert line or proc.poll() is None, "demo exited early"
            seen += line
        assert len(marked_pids(mark)) >= 5  # the demo, 2 engines, the service and Envoy
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
    assert proc.returncode == 130
    assert wait_until_gone(mark) == []
