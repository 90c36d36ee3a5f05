"""Chat, string-prompt and Anthropic traffic routed precisely, end to end: a real Envoy, mock vLLM
engines that tokenize with a tiny HF tokenizer built at run time, and the service with a local
``token-producer`` on the same directory. Requests sharing a prefix land on the engine that caches
it, and the cached tokens the service predicted equal the ones the engine reports."""

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
BLOCK = 16
FAST_ENGINES = ["--prefill-tokens-per-s", "400000", "--decode-ms-per-token", "1"]
WORDS = ("cache", "prefix", "router", "engine", "token", "block", "request", "gateway", "model", "shared")


def text(seed: int, words: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) + str(rng.randrange(100)) for _ in range(words))


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("tiny-tokenizer")
    build_tiny_tokenizer(directory)
    return directory


@pytest.fixture(scope="module")
def cluster(tokenizer_dir: Path) -> Iterator[LocalCluster]:
    with LocalCluster(
        num_engines=3, model=MODEL, block_size=BLOCK, num_blocks=4096, engine_args=FAST_ENGINES,
        tokenizer=tokenizer_dir,
    ) as c:
        yield c


@pytest.fixture(scope="module")
def client(cluster: LocalCluster) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=cluster.listener_url + "/v1", api_key="unused", max_retries=0, timeout=30) as c:
        yield c


def decision(cluster: LocalCluster, request_id: str) -> dict:
    response = httpx.get(f"{cluster.admin_url}/debug/decisions", params={"request_id": request_id}, timeout=10)
    (found,) = response.json()["decisions"]
    return found  # type: ignore[no-any-return]


def chat(client: openai.OpenAI, messages: list[dict], request_id: str) -> tuple[str, int, int]:
    """(engine that served, its prompt tokens, its cached tokens)."""
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=messages, max_tokens=4, extra_headers={"x-request-id": request_id}  # type: ignore[arg-type]
    )
    body = raw.parse()
    assert body.usage is not None and body.usage.prompt_tokens_details is not None
    return raw.headers["x-mock-vllm-endpoint"], body.usage.prompt_tokens, body.usage.prompt_tokens_details.cached_tokens or 0


def test_chats_sharing_a_system_prompt_land_on_the_engine_that_caches_it(
    cluster: LocalCluster, client: openai.OpenAI
) -> None:
    for tenant in range(3):
        system = {"role": "system", "content": text(100 + tenant, 120)}
        first, prompt_tokens, cached = chat(client, [system, {"role": "user", "content": text(200 + tenant, 8)}],
                                            f"chat-{tenant}-0")  # fmt: skip
        assert cached == 0
        routed = decision(cluster, f"chat-{tenant}-0")
        assert routed["destination"] == first
        assert routed["promptTokens"] == prompt_tokens  # the service's ids are the engine's
        assert routed["tokenizeOutcome"] == "local:ok"
        for turn in range(1, 3):
            request_id = f"chat-{tenant}-{turn}"
            served, _, cached = chat(client, [system, {"role": "user", "content": text(300 + 10 * tenant + turn, 9)}],
                                     request_id)  # fmt: skip
            assert served == first
            assert cached > 5 * BLOCK  # the long system prompt came from the cache
            assert decision(cluster, request_id)["cachedTokensPredicted"] == cached


def test_a_multi_turn_conversation_follows_its_own_history(cluster: LocalCluster, client: openai.OpenAI) -> None:
    messages = [{"role": "system", "content": text(400, 40)}]
    served_by = set()
    for turn in range(4):
        messages.append({"role": "user", "content": text(500 + turn, 30)})
        served, _, cached = chat(client, messages, f"conv-{turn}")
        served_by.add(served)
        if turn:
            assert decision(cluster, f"conv-{turn}")["cachedTokensPredicted"] == cached > 0
        messages.append({"role": "assistant", "content": text(600 + turn, 12)})
    assert len(served_by) == 1


def test_string_prompt_completions_route_precisely(cluster: LocalCluster, client: openai.OpenAI) -> None:
    shared = text(700, 150)
    first = client.completions.with_raw_response.create(
        model=MODEL, prompt=shared + " " + text(701, 5), max_tokens=4, extra_headers={"x-request-id": "str-0"}
    )
    engine = first.headers["x-mock-vllm-endpoint"]
    again = client.completions.with_raw_response.create(
        model=MODEL, prompt=shared + " " + text(702, 5), max_tokens=4, extra_headers={"x-request-id": "str-1"}
    )
    assert again.headers["x-mock-vllm-endpoint"] == engine
    usage = again.parse().usage
    assert usage is not None and usage.prompt_tokens_details is not None
    cached = usage.prompt_tokens_details.cached_tokens
    assert cached and cached > 5 * BLOCK
    assert decision(cluster, "str-1")["cachedTokensPredicted"] == cached


def test_anthropic_messages_route_precisely(cluster: LocalCluster) -> None:
    system = text(800, 120)
    engines = []
    for i in range(3):
        body = {"model": MODEL, "max_tokens": 4, "system": system,
                "messages": [{"role": "user", "content": [{"type": "text", "text": text(810 + i, 6)}]}]}  # fmt: skip
        response = httpx.post(f"{cluster.listener_url}/v1/messages", json=body, headers={"x-request-id": f"msg-{i}"},
                              timeout=30)  # fmt: skip
        assert response.status_code == 200, response.text
        engines.append(response.headers["x-mock-vllm-endpoint"])
        if i:
            usage = response.json()["usage"]
            assert decision(cluster, f"msg-{i}")["cachedTokensPredicted"] == usage["cache_read_input_tokens"] > 0
    assert len(set(engines)) == 1


def test_a_malformed_chat_body_gets_a_400_naming_the_field(cluster: LocalCluster) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}, {"content": "no role"}]}
    response = httpx.post(f"{cluster.listener_url}/v1/chat/completions", json=body, timeout=30)
    assert response.status_code == 400
    assert "messages[1]" in response.text


def test_debug_score_tokenizes_chat_bodies(cluster: LocalCluster) -> None:
    body = {"model": MODEL, "messages": [{"role": "system", "content": text(900, 60)}, {"role": "user", "content": "hi"}]}
    answer = httpx.post(f"{cluster.admin_url}/debug/score", params={"path": "/v1/chat/completions"}, json=body,
                        timeout=10).json()  # fmt: skip
    assert answer["promptTokens"] > 60 and answer["tokenizeOutcome"] == "local:ok"
    assert all(e["totalBlocks"] == answer["promptTokens"] // BLOCK for e in answer["endpoints"])
