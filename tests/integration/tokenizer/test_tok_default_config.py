"""The service with no configuration file tokenizes chat bodies with the model's tokenizer found in
the Hugging Face cache: ``ppc-extproc serve`` (no ``--config-file``) runs with ``HF_HUB_CACHE``
pointing at a temporary hub laid out as ``huggingface_hub`` does, and ``/debug/score`` reports the
token count transformers' ``apply_chat_template`` gives. A model with no tokenizer anywhere is
routed by load, counted per model and warned about once."""

from __future__ import annotations

import random
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ppc_extproc_lab.localcluster.ports import PortAllocator, free_port
from ppc_extproc_lab.localcluster.processes import ManagedProcess
from ppc_extproc_lab.localcluster.readiness import wait_for_http
from ppc_extproc_lab.tiny_tokenizer import build_tiny_tokenizer

pytestmark = pytest.mark.integration

MODEL = "tiny-org/tiny-chat"


def hub_with(tmp: Path, model: str) -> Path:
    """A hub cache holding ``model``'s tokenizer at revision ``abc123`` (refs/main names it)."""
    hub = tmp / "hub"
    repo = hub / ("models--" + model.replace("/", "--"))
    snapshot = repo / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    build_tiny_tokenizer(snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    return hub


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return hub_with(tmp_path_factory.mktemp("hf"), MODEL)


@pytest.fixture(scope="module")
def service_proc(hub: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, ManagedProcess]]:
    logs = tmp_path_factory.mktemp("logs")
    # An endpoint nobody serves, on a loopback address of its own (its KV subscriber never
    # connects, so it stays routable); /debug/score is a dry run and dials nothing else.
    ip = f"127.{random.randrange(100, 250)}.{random.randrange(1, 250)}.{random.randrange(2, 250)}"
    ports = PortAllocator()
    grpc_port, admin_port = ports.ports(2)
    proc = ManagedProcess(
        "service",
        [sys.executable, "-m", "ppc_extproc", "serve", "--grpc-port", str(grpc_port), "--admin-port", str(admin_port),
         "--admin-address", "127.0.0.1", "--endpoints", f"{ip}:{free_port()}"],
        log_path=logs / "service.log",
        env={"HF_HUB_CACHE": str(hub), "HF_HOME": str(logs / "unused-hf-home"), "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    try:
        proc.start()
        url = f"http://127.0.0.1:{admin_port}"
        wait_for_http(f"{url}/readyz", timeout=60, process=proc)
        yield url, proc
    finally:
        proc.stop(10)


@pytest.fixture(scope="module")
def service(service_proc: tuple[str, ManagedProcess]) -> str:
    return service_proc[0]


def score(url: str, body: dict[str, Any]) -> dict[str, Any]:
    response = httpx.post(f"{url}/debug/score", params={"path": "/v1/chat/completions"}, json=body, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


def test_debug_score_counts_the_tokens_transformers_gives(service: str, hub: Path) -> None:
    transformers = pytest.importorskip("transformers")
    snapshot = hub / "models--tiny-org--tiny-chat" / "snapshots" / "abc123"
    reference = transformers.AutoTokenizer.from_pretrained(str(snapshot))
    messages = [
        {"role": "system", "content": "You are a terse assistant that explains caches. " * 8},
        {"role": "user", "content": "What is a KV cache, and why does prefix routing help?"},
    ]
    expected = reference.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    expected = expected["input_ids"] if isinstance(expected, dict) or hasattr(expected, "keys") else expected
    answer = score(service, {"model": MODEL, "messages": messages, "max_tokens": 4})
    assert answer["tokenizeOutcome"] == "local:ok"
    assert answer["promptTokens"] == len(expected) > 50
    (endpoint,) = answer["endpoints"]
    assert endpoint["totalBlocks"] == len(expected) // 16  # the embedded default's block size


def test_a_model_without_a_tokenizer_is_routed_by_load_and_counted(service_proc: tuple[str, ManagedProcess]) -> None:
    service, proc = service_proc
    body = {"model": "nobody/has-this", "messages": [{"role": "user", "content": "hi"}]}
    for _ in range(3):
        answer = score(service, body)
        assert answer["tokenizeOutcome"] == "local:no_tokenizer" and answer["promptTokens"] == 0
        assert answer["picked"]  # routed all the same
    state = httpx.get(f"{service}/debug/state", timeout=10).json()
    text = str(state)
    assert "nobody/has-this" in text and "'no_tokenizer': 3" in text
    metrics = httpx.get(f"{service}/metrics", timeout=10).text
    assert 'outcome="no_tokenizer"' in metrics
    warnings = [line for line in proc.log_tail(400).splitlines() if "tokenizer_not_found" in line and "nobody/has-this" in line]
    assert len(warnings) == 1 and "warn" in warnings[0].lower()


def test_a_request_chat_template_is_routed_by_load_not_refused(service: str) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "chat_template": "{{ messages }}"}
    answer = score(service, body)
    assert answer["tokenizeOutcome"] == "local:untrusted_chat_template" and answer["picked"]


def test_a_malformed_chat_body_still_gets_a_400_naming_the_field(service: str) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": 5}]}
    response = httpx.post(f"{service}/debug/score", params={"path": "/v1/chat/completions"}, json=body, timeout=30)
    assert response.status_code == 400 and "messages[0].content" in response.text
