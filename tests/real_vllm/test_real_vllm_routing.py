"""Chat and string-prompt traffic routed precisely to real vLLM 0.32 engines, through a real Envoy.

``LocalCluster`` runs three vLLM engines (``vllm_launcher.py`` turns the mock-engine flags into
``vllm serve`` ones: prefix caching, KV events over ZMQ per loopback IP, block size 32, prompt token
details), the service with a local ``token-producer`` on the engines' model directory, and Envoy.
Requests sharing a prefix must land on the engine that caches it (Envoy's access log names the
upstream that served), and the cached tokens the service predicted for that engine
(``/debug/decisions`` ``cachedTokensPredicted``) must equal ``usage.prompt_tokens_details.cached_tokens``.

Opt-in: ``pytest --real-vllm tests/real_vllm`` (see ``scripts/setup_real_vllm.sh``).
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from real_vllm_helpers import BLOCK, ENGINE_ENV, MODEL, ROUTING_LOG, STARTUP_TIMEOUT, engine_command

from ppc_extproc.tokenizer import LocalTokenizer
from ppc_extproc_lab.localcluster import LocalCluster, wait_for

pytestmark = [pytest.mark.real_vllm, pytest.mark.integration, pytest.mark.timeout(1800)]

WORDS = ("cache", "prefix", "router", "engine", "token", "block", "request", "model", "prompt", "system", "user",
         "tool", "weather", "city", "answer", "question", "context", "message", "reply", "value", "key")  # fmt: skip


def text(seed: int, words: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) + str(rng.randrange(100)) for _ in range(words))


@pytest.fixture(scope="module")
def cluster(vllm_py: str, model_dir: Path) -> Iterator[LocalCluster]:
    with LocalCluster(
        num_engines=3, model=MODEL, block_size=BLOCK, num_blocks=4096, tokenizer=model_dir,
        engine_command=engine_command(vllm_py), env=ENGINE_ENV, startup_timeout=STARTUP_TIMEOUT, stop_timeout=30,
        envoy_args=["--file-flush-interval-msec", "50"],  # the access log names the upstream: flush it soon
    ) as c:  # fmt: skip
        yield c


@pytest.fixture(scope="module")
def client(cluster: LocalCluster) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=cluster.listener_url + "/v1", api_key="unused", max_retries=0, timeout=120) as c:
        yield c


def decision(cluster: LocalCluster, request_id: str) -> dict[str, Any]:
    response = httpx.get(f"{cluster.admin_url}/debug/decisions", params={"request_id": request_id}, timeout=10)
    (found,) = response.json()["decisions"]
    return found  # type: ignore[no-any-return]


def served_by(cluster: LocalCluster, request_id: str) -> str:
    """The upstream Envoy sent ``request_id`` to, from its access log (``upstream=ip:port id=…``)."""
    log_path = cluster.log_dir / "envoy.log"
    pattern = re.compile(rf"upstream=(\S+) id={re.escape(request_id)}$", re.MULTILINE)
    found: list[str] = []

    def logged() -> bool:
        found[:] = pattern.findall(log_path.read_text(encoding="utf-8", errors="replace"))
        return bool(found)

    wait_for(logged, what=f"Envoy's access log line of {request_id}", timeout=30, process=cluster.envoy_process)
    (upstream,) = found
    return upstream


def observe(cluster: LocalCluster, request_id: str, usage: Any) -> tuple[str, int, dict[str, Any]]:
    """(engine that served, its reported cached tokens, the service's decision), checked against each other."""
    assert usage is not None and usage.prompt_tokens_details is not None, "start vLLM with --enable-prompt-tokens-details"
    cached = usage.prompt_tokens_details.cached_tokens or 0
    routed = decision(cluster, request_id)
    upstream = served_by(cluster, request_id)
    engine = "ABC"[cluster.engine_endpoints.index(upstream)]
    ROUTING_LOG.append(
        f"{request_id}: engine {engine}, prompt {usage.prompt_tokens} tokens, cached reported {cached}, "
        f"predicted {routed['cachedTokensPredicted']}"
    )
    assert routed["destination"] == upstream
    assert routed["tokenizeOutcome"] == "local:ok"
    assert routed["promptTokens"] == usage.prompt_tokens  # the service's ids are the engine's
    assert routed["cachedTokensPredicted"] == cached
    return upstream, cached, routed


def chat(cluster: LocalCluster, client: openai.OpenAI, messages: list[dict[str, Any]], request_id: str) -> tuple[str, int]:
    body = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=4, extra_headers={"x-request-id": request_id}  # type: ignore[arg-type]
    )
    upstream, cached, _ = observe(cluster, request_id, body.usage)
    return upstream, cached


def test_chats_sharing_a_system_prompt_land_on_the_engine_that_caches_it(
    cluster: LocalCluster, client: openai.OpenAI
) -> None:
    for tenant in range(3):
        system = {"role": "system", "content": text(100 + tenant, 150)}
        first, cached = chat(cluster, client, [system, {"role": "user", "content": text(200 + tenant, 8)}], f"chat-{tenant}-0")
        assert cached == 0
        for turn in range(1, 3):
            user = {"role": "user", "content": text(300 + 10 * tenant + turn, 9)}
            served, cached = chat(cluster, client, [system, user], f"chat-{tenant}-{turn}")
            assert served == first
            assert cached >= 4 * BLOCK  # the long system prompt came from the cache


def test_a_multi_turn_conversation_follows_its_own_history(cluster: LocalCluster, client: openai.OpenAI) -> None:
    messages: list[dict[str, Any]] = [{"role": "system", "content": text(400, 60)}]
    served_by_turn, cached_by_turn = [], []
    for turn in range(4):
        messages.append({"role": "user", "content": text(500 + turn, 40)})
        served, cached = chat(cluster, client, messages, f"conv-{turn}")
        served_by_turn.append(served)
        cached_by_turn.append(cached)
        messages.append({"role": "assistant", "content": text(600 + turn, 15)})
    assert len(set(served_by_turn)) == 1
    assert cached_by_turn[0] == 0 < cached_by_turn[1] < cached_by_turn[2] < cached_by_turn[3]


def test_string_prompt_completions_route_precisely(cluster: LocalCluster, client: openai.OpenAI) -> None:
    shared = text(700, 200)
    engines = []
    for i in range(3):
        request_id = f"str-{i}"
        body = client.completions.create(
            model=MODEL, prompt=shared + " " + text(701 + i, 5), max_tokens=4, extra_headers={"x-request-id": request_id}
        )
        served, cached, _ = observe(cluster, request_id, body.usage)
        engines.append(served)
        assert (cached == 0) if i == 0 else (cached >= 4 * BLOCK)
    assert len(set(engines)) == 1


def test_a_repeated_prompt_of_whole_blocks_is_predicted_with_the_last_token_rule(
    cluster: LocalCluster, client: openai.OpenAI, model_dir: Path
) -> None:
    local = LocalTokenizer.from_dir(model_dir)
    words = 60
    while len(local.tokenize("completions", {"prompt": text(800, words)}).prompts[0]) // 4 % BLOCK:
        words += 1
    prompt = text(800, words)
    engines = []
    for i in range(2):
        body = client.completions.create(model=MODEL, prompt=prompt, max_tokens=4, extra_headers={"x-request-id": f"whole-{i}"})
        served, cached, routed = observe(cluster, f"whole-{i}", body.usage)
        engines.append(served)
    assert engines[0] == engines[1]
    assert body.usage is not None and body.usage.prompt_tokens % BLOCK == 0
    # vLLM never serves the last prompt token from the cache, so the block holding it is computed
    # again (vllm/v1/core/kv_cache_manager.py get_computed_blocks: max_cache_hit_length = num_tokens - 1).
    assert cached == body.usage.prompt_tokens - BLOCK
    assert routed["cachedTokensPredicted"] == cached
