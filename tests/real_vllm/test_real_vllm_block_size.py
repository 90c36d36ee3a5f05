"""A real vLLM engine at block size 32 behind a service hashing at 16: the service learns the
engine's block from its BlockStored events, and the cached tokens it predicts
(``/debug/decisions`` ``cachedTokensPredicted``) equal ``usage.prompt_tokens_details.cached_tokens``
on every probe, including prompts whose cached prefix ends inside an engine block.

Opt-in: ``pytest --real-vllm tests/real_vllm`` (see ``scripts/setup_real_vllm.sh``).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from real_vllm_helpers import ENGINE_ENV, MODEL, ROUTING_LOG, STARTUP_TIMEOUT, engine_command

from ppc_extproc_lab.localcluster import LocalCluster
from ppc_extproc_lab.localcluster.service_config import default_service_config

pytestmark = [pytest.mark.real_vllm, pytest.mark.integration, pytest.mark.timeout(1800)]

ENGINE_BLOCK = 32
CONFIG_BLOCK = 16


@pytest.fixture(scope="module")
def cluster(vllm_py: str, model_dir: Path) -> Iterator[LocalCluster]:
    with LocalCluster(
        num_engines=1, model=MODEL, num_blocks=4096, tokenizer=model_dir,
        per_engine_args=[["--block-size", str(ENGINE_BLOCK)]],
        service_config=default_service_config(block_size=CONFIG_BLOCK),
        engine_command=engine_command(vllm_py), env=ENGINE_ENV, startup_timeout=STARTUP_TIMEOUT, stop_timeout=30,
    ) as c:  # fmt: skip
        yield c


def test_predictions_use_the_engines_block_not_the_hashing_unit(cluster: LocalCluster) -> None:
    rng = random.Random(5)
    mismatches = []
    with openai.OpenAI(base_url=cluster.listener_url + "/v1", api_key="unused", max_retries=0, timeout=120) as client:
        for i in range(12):
            # Token-id prompts: 40..200 tokens, most not a multiple of 32.
            prompt = [rng.randrange(100, 400) for _ in range(rng.randrange(40, 200))]
            for turn in range(2):
                request_id = f"bs-{i}-{turn}"
                body = client.completions.create(model=MODEL, prompt=prompt, max_tokens=2,
                                                 extra_headers={"x-request-id": request_id})  # fmt: skip
                assert body.usage is not None and body.usage.prompt_tokens_details is not None
                cached = body.usage.prompt_tokens_details.cached_tokens or 0
                response = httpx.get(f"{cluster.admin_url}/debug/decisions", params={"request_id": request_id}, timeout=10)
                (decision,) = response.json()["decisions"]
                ROUTING_LOG.append(f"{request_id}: prompt {len(prompt)}, cached reported {cached}, "
                                   f"predicted {decision['cachedTokensPredicted']}")  # fmt: skip
                if decision["cachedTokensPredicted"] != cached:
                    mismatches.append((request_id, len(prompt), cached, decision["cachedTokensPredicted"]))
    sizes = httpx.get(cluster.admin_url + "/metrics", timeout=10).text
    assert f'ppc_extproc_engine_block_size{{endpoint="{cluster.engine_endpoints[0]}"}} {ENGINE_BLOCK}.0' in sizes
    assert not mismatches, mismatches
