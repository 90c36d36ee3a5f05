"""Chat routed precisely with the embedded default configuration and no tokenizer flag: a real
Envoy, mock vLLM engines that tokenize with a tiny HF tokenizer (and serve vLLM's render routes),
and the service on ``config/default.yaml`` (only the KV-event ports patched in). The service finds
the tokenizer by itself — in the Hugging Face cache when it is there, else through the engines'
render endpoints — and chats sharing a system prompt land on the engine that cached it."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from ppc_extproc_lab.localcluster import LocalCluster
from ppc_extproc_lab.tiny_tokenizer import build_tiny_tokenizer

pytestmark = pytest.mark.integration

MODEL = "mock-model"
FAST_ENGINES = ["--prefill-tokens-per-s", "400000", "--decode-ms-per-token", "1"]
WORDS = ("cache", "prefix", "router", "engine", "token", "block", "request", "gateway", "model", "shared")


def text(seed: int, words: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) + str(rng.randrange(100)) for _ in range(words))


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_tokenizer(tmp_path_factory.mktemp("tiny"))


def hub_cache(root: Path, tokenizer_dir: Path | None) -> Path:
    """A hub cache: empty, or holding ``MODEL``'s tokenizer as ``huggingface_hub`` lays it out."""
    hub = root / "hub"
    hub.mkdir(parents=True)
    if tokenizer_dir is not None:
        repo = hub / f"models--{MODEL}"
        (repo / "refs").mkdir(parents=True)
        (repo / "refs" / "main").write_text("r1")
        snapshot = repo / "snapshots" / "r1"
        snapshot.mkdir(parents=True)
        for f in tokenizer_dir.iterdir():
            (snapshot / f.name).symlink_to(f)
    return hub


@pytest.fixture(scope="module", params=["engine-render", "hf-cache"])
def cluster(request: pytest.FixtureRequest, tokenizer_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, LocalCluster]]:
    hub = hub_cache(tmp_path_factory.mktemp(request.param), tokenizer_dir if request.param == "hf-cache" else None)
    with LocalCluster(
        num_engines=3, model=MODEL, num_blocks=4096,
        # The engines get the tokenizer; the service gets no path (service_config=None: the embedded default).
        engine_args=[*FAST_ENGINES, "--tokenizer", str(tokenizer_dir)],
        env={"HF_HUB_CACHE": str(hub)},
    ) as c:  # fmt: skip
        yield request.param, c


def chat(client: openai.OpenAI, messages: list[dict[str, str]], request_id: str) -> tuple[str, int]:
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=messages, max_tokens=4, extra_headers={"x-request-id": request_id}  # type: ignore[arg-type]
    )
    usage = raw.parse().usage
    assert usage is not None and usage.prompt_tokens_details is not None
    return raw.headers["x-mock-vllm-endpoint"], usage.prompt_tokens_details.cached_tokens or 0


def decision(c: LocalCluster, request_id: str) -> dict:
    response = httpx.get(f"{c.admin_url}/debug/decisions", params={"request_id": request_id}, timeout=10)
    (found,) = response.json()["decisions"]
    return found  # type: ignore[no-any-return]


def test_the_second_chat_lands_on_the_engine_that_cached_the_first(cluster: tuple[str, LocalCluster]) -> None:
    how, c = cluster
    with openai.OpenAI(base_url=c.listener_url + "/v1", api_key="unused", max_retries=0, timeout=30) as client:
        for tenant in range(3):
            system = {"role": "system", "content": text(100 + tenant, 120)}
            first, cached = chat(client, [system, {"role": "user", "content": text(200 + tenant, 8)}], f"{how}-{tenant}-0")
            assert cached == 0
            assert decision(c, f"{how}-{tenant}-0")["tokenizeOutcome"] == "local:ok"
            served, cached = chat(client, [system, {"role": "user", "content": text(300 + tenant, 9)}], f"{how}-{tenant}-1")
            assert served == first
            assert cached > 5 * 16  # the long system prompt came from the cache
            assert decision(c, f"{how}-{tenant}-1")["cachedTokensPredicted"] == cached
    state = httpx.get(f"{c.admin_url}/debug/state", timeout=10).json()
    assert f"'{MODEL}': {{'source': '{'render' if how == 'engine-render' else 'hf_cache'}'" in str(state)
