"""P/D end to end through real Envoy: Envoy → ppc-extproc → the decode pod's sidecar → the decode
mock, with two prefill mocks, all on loopback ports chosen at run time.

The service runs the lab's ``pd`` policy (decode-first ``disagg-profile-handler``,
``prefix-based-pd-decider`` on the precise producer). What the client, the sidecar and each engine
saw is read back from them: the response headers, ``/sidecar/requests``, ``/mock/requests`` and
``/mock/state``.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from ppc_extproc_lab.localcluster import LocalCluster, wait_for
from ppc_extproc_lab.workload.pd import pd_config

pytestmark = pytest.mark.integration

MODEL = "mock-model"
BLOCK = 16
NON_CACHED = 64
FAST_ENGINES = ["--prefill-tokens-per-s", "400000", "--decode-ms-per-token", "1"]
ROLES = ["prefill", "prefill", "decode"]
PREFILL_PARAMS = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                  "remote_block_ids": None, "remote_host": None, "remote_port": None}
_ids = itertools.count()


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(num_engines=3, roles=ROLES, model=MODEL, block_size=BLOCK, num_blocks=2048,
                      engine_args=FAST_ENGINES, service_config=pd_config(non_cached_tokens=NON_CACHED)) as c:
        yield c


def prompt(seed: int, length: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1, 150_000) for _ in range(length)]


def get(url: str) -> Any:
    response = httpx.get(url, timeout=10)
    response.raise_for_status()
    return response.json()


def complete(cluster: LocalCluster, tokens: list[int], max_tokens: int = 8) -> tuple[str, httpx.Response]:
    request_id = f"pd-e2e-{next(_ids)}"
    response = httpx.post(cluster.listener_url + "/v1/completions", timeout=30, headers={"x-request-id": request_id},
                          json={"model": MODEL, "prompt": tokens, "max_tokens": max_tokens})
    assert response.status_code == 200, response.text
    return request_id, response


def entry(log: list[dict[str, Any]], request_id: str) -> dict[str, Any] | None:
    return next((e for e in reversed(log) if e.get("x_request_id") == request_id), None)


def indexed_on(cluster: LocalCluster, tokens: list[int]) -> dict[str, int]:
    """Per endpoint, the consecutive blocks of ``tokens`` the service holds, any tier (speculative too)."""
    answer = httpx.post(cluster.admin_url + "/debug/score", json={"model": MODEL, "prompt": tokens}, timeout=10).json()
    return {e["endpoint"]: sum(e["cachedBlocksByTier"].values()) for e in answer["endpoints"]}


def test_long_uncached_prompt_is_disaggregated_with_llmd_legs(cluster: LocalCluster) -> None:
    decode, prefill = cluster.indices("decode")[0], cluster.indices("prefill")
    tokens = prompt(1, 20 * BLOCK + 5)
    request_id, response = complete(cluster, tokens, max_tokens=12)
    assert response.headers["x-mock-vllm-endpoint"] == cluster.engine_endpoints[decode]
    assert response.headers["x-mock-vllm-kv-transfer"] == "decode"
    # The sidecar was named a prefill endpoint in x-prefiller-host-port.
    sidecar = entry(get(cluster.engine_urls[decode] + "/sidecar/requests"), request_id)
    assert sidecar is not None and sidecar["status"] == 200
    prefill_endpoints = [cluster.engine_endpoints[i] for i in prefill]
    assert sidecar["header"] in prefill_endpoints
    chosen = prefill[prefill_endpoints.index(sidecar["header"])]
    # The prefill leg: max_tokens 1, not streamed, kv_transfer_params asking for a remote decode.
    leg = entry(get(cluster.mock_urls[chosen] + "/mock/requests"), request_id)
    assert leg is not None
    assert (leg["max_tokens"], leg["min_tokens"], leg["stream"]) == (1, 1, False)
    assert leg["kv_transfer_params"] == PREFILL_PARAMS
    # The decode leg carries the prefiller's kv_transfer_params (vLLM NixlConnector's fields).
    dleg = entry(get(cluster.mock_urls[decode] + "/mock/requests"), request_id)
    assert dleg is not None and dleg["max_tokens"] == 12
    kv = dleg["kv_transfer_params"]
    prefiller_state = get(cluster.mock_urls[chosen] + "/mock/state")
    assert kv["do_remote_prefill"] is True and kv["do_remote_decode"] is False
    assert kv["remote_engine_id"] == prefiller_state["kv_engine_id"]
    assert kv["remote_host"] == cluster.engine_ips[chosen]
    assert len(kv["remote_block_ids"]) == -(-len(tokens) // BLOCK) and kv["remote_request_id"]
    assert get(cluster.mock_urls[decode] + "/mock/state")["kv_transfer_tokens"] >= len(tokens)


def test_short_and_well_cached_prompts_carry_no_header(cluster: LocalCluster) -> None:
    decode = cluster.indices("decode")[0]
    short = prompt(2, NON_CACHED - 10)
    request_id, response = complete(cluster, short)
    assert "x-mock-vllm-kv-transfer" not in response.headers
    sidecar = entry(get(cluster.engine_urls[decode] + "/sidecar/requests"), request_id)
    assert sidecar is not None and sidecar["header"] is None
    # A prompt below one block is decided too (on its token count): no P/D, served locally.
    _, tiny = complete(cluster, prompt(3, 5))
    assert "x-mock-vllm-kv-transfer" not in tiny.headers
    # A long prompt, then the same context with fewer than nonCachedTokens new tokens: decode-only
    # on the decode engine that received it (credited with the prompt's blocks).
    context = prompt(4, 24 * BLOCK)
    _, first = complete(cluster, context)
    assert first.headers["x-mock-vllm-kv-transfer"] == "decode"
    wait_for(lambda: indexed_on(cluster, context).get(cluster.engine_endpoints[decode], 0) >= 24,
             what="the decode engine credited with the transferred prompt")
    request_id, again = complete(cluster, context + prompt(5, NON_CACHED // 2))
    assert "x-mock-vllm-kv-transfer" not in again.headers
    assert again.headers["x-mock-vllm-endpoint"] == cluster.engine_endpoints[decode]
    assert again.json()["usage"]["prompt_tokens_details"]["cached_tokens"] >= 24 * BLOCK - BLOCK
    sidecar = entry(get(cluster.engine_urls[decode] + "/sidecar/requests"), request_id)
    assert sidecar is not None and sidecar["header"] is None


def test_client_usage_shows_the_prefillers_cached_tokens(cluster: LocalCluster) -> None:
    decode, prefill = cluster.indices("decode")[0], cluster.indices("prefill")
    shared = prompt(6, 10 * BLOCK)
    warm = prefill[1]
    # Cache 10 blocks on one prefill engine (around the router); its KV events reach the service.
    httpx.post(cluster.mock_urls[warm] + "/v1/completions", timeout=10,
               json={"model": MODEL, "prompt": shared, "max_tokens": 1}).raise_for_status()
    wait_for(lambda: indexed_on(cluster, shared).get(cluster.engine_endpoints[warm], 0) >= 10,
             what="the warmed prefill engine's blocks indexed")
    tokens = shared + prompt(7, 8 * BLOCK)
    request_id, response = complete(cluster, tokens)
    assert response.headers["x-mock-vllm-kv-transfer"] == "decode"
    sidecar = entry(get(cluster.engine_urls[decode] + "/sidecar/requests"), request_id)
    assert sidecar is not None and sidecar["header"] == cluster.engine_endpoints[warm]  # prefix-scored
    usage = response.json()["usage"]
    # The prefiller hit the 10 warm blocks; the decoder, which received everything, said all 18.
    assert usage["prompt_tokens_details"]["cached_tokens"] == 10 * BLOCK
    assert usage["prompt_tokens"] == len(tokens)


def test_streamed_p_d_through_envoy(cluster: LocalCluster) -> None:
    tokens = prompt(8, 16 * BLOCK)
    body = {"model": MODEL, "prompt": tokens, "max_tokens": 10, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", cluster.listener_url + "/v1/completions", json=body, timeout=30) as response:
        assert response.status_code == 200 and response.headers["x-mock-vllm-kv-transfer"] == "decode"
        lines = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    assert '"cached_tokens":0' in lines[-2]  # the (cold) prefiller's count, not the decoder's
