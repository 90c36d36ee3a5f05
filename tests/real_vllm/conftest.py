"""Fixtures of the real-vLLM tests: the vLLM python (or a skip), the tiny model, one render engine.

The routing test starts its own engines through ``LocalCluster``; the parity engine here is
module-scoped, so the two never run at the same time (each vLLM engine takes ~2 GB).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from real_vllm_helpers import (
    ENGINE_ENV,
    MODEL,
    OBSERVED,
    ROUTING_LOG,
    STARTUP_TIMEOUT,
    build_tiny_model,
    engine_command,
    skip_reason,
    vllm_python,
)

from ppc_extproc_lab.localcluster import ManagedProcess, PortAllocator, check_loopback_ip, wait_for_http


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """What was compared and where requests went (the numbers BENCHMARKS.md records)."""
    if not OBSERVED and not ROUTING_LOG:
        return
    terminalreporter.section("real vLLM observations")
    for topic, counts in sorted(OBSERVED.items()):
        terminalreporter.write_line(f"{topic}: {sum(counts.values())} bodies: {dict(sorted(counts.items()))}")
    for line in ROUTING_LOG:
        terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def vllm_py() -> str:
    python = vllm_python()
    if python is None:
        pytest.skip(skip_reason())
    return python


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def render_url(vllm_py: str, model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One vLLM engine (render routes on, auto tool choice with the ``pythonic`` parser)."""
    ip = "127.0.0.2"
    check_loopback_ip(ip)
    port, kv_port = PortAllocator().ports(2, [ip])
    argv = engine_command(vllm_py, "--enable-auto-tool-choice", "--tool-call-parser", "pythonic") + [
        "--host", ip, "--port", str(port), "--model", MODEL, "--tokenizer", str(model_dir),
        "--kv-events-endpoint", f"tcp://{ip}:{kv_port}",
    ]  # fmt: skip
    log_path = tmp_path_factory.mktemp("vllm-render") / "engine.log"
    engine = ManagedProcess("vllm-render", argv, log_path=log_path, env=ENGINE_ENV)
    try:
        engine.start()
        url = f"http://{ip}:{port}"
        wait_for_http(f"{url}/health", timeout=STARTUP_TIMEOUT, process=engine)
        yield url
    finally:
        engine.stop(30)


@pytest.fixture(scope="module")
def render(render_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=render_url, timeout=60) as client:
        yield client
