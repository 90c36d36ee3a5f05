"""Engines at block sizes 16, 32 and 64 and a hybrid layout (64-token full-attention blocks plus
sliding-window and Mamba groups), the service hashing at 16: the cached tokens it predicts for the
serving engine equal what that engine reports in ``usage`` (real Envoy, mock engines, the service's
``ppc_extproc_cached_tokens_error_tokens`` histogram)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from ppc_extproc_lab.localcluster import LocalCluster, default_service_config, wait_for

pytestmark = pytest.mark.integration

LAYOUTS = [["--block-size", "16"], ["--block-size", "32"], ["--block-size", "64"],
           ["--block-size", "64", "--kv-groups", "hybrid"]]  # fmt: skip
FAST_ENGINES = ["--prefill-tokens-per-s", "1000000", "--decode-ms-per-token", "1", "--num-blocks", "4096"]
PROBES = 200


def _samples(cluster: LocalCluster) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(cluster.admin_url + "/metrics", timeout=10).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _caught_up(cluster: LocalCluster, engine: int) -> bool:
    seq = int(httpx.get(cluster.engine_urls[engine] + "/mock/state", timeout=10).json()["seq"]) - 1
    key = ("ppc_extproc_kv_source_last_seq", (("endpoint", cluster.engine_endpoints[engine]),))
    return _samples(cluster).get(key, -1.0) == seq  # no event yet: nothing to wait for


def _config_without_batch_window() -> dict[str, Any]:
    """Each probe waits until the service has applied its warm-up's events (``_caught_up``), with
    no request to end the KV-event thread's batch window: with the default 1 s window the 200
    probes would wait up to a second each."""
    config = default_service_config()
    for plugin in config["plugins"]:
        if plugin.get("type") == "precise-prefix-cache-producer":
            plugin.setdefault("parameters", {}).setdefault("kvEventsConfig", {})["batchWindow"] = "0s"
    return config


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(num_engines=len(LAYOUTS), engine_args=FAST_ENGINES, per_engine_args=LAYOUTS,
                      service_args=["--usage-sample-rate", "1"],
                      service_config=_config_without_batch_window()) as c:  # fmt: skip
        yield c


def test_predicted_cached_tokens_equal_the_engines_own_on_every_block_size(cluster: LocalCluster) -> None:
    rng = random.Random(3)
    served: dict[str, int] = {}
    reported_total = 0
    with httpx.Client(timeout=30) as client:
        for i in range(PROBES):
            engine = i % len(LAYOUTS)
            prefix = [rng.randrange(1000, 30000) for _ in range(rng.choice([16, 32, 64, 100, 128, 150, 200, 256]))]
            # Warm the prefix on one engine directly, and wait until the service has its events.
            client.post(cluster.engine_urls[engine] + "/v1/completions",
                        json={"model": cluster.model, "prompt": prefix, "max_tokens": 1}).raise_for_status()  # fmt: skip
            wait_for(lambda e=engine: _caught_up(cluster, e), what="events applied", timeout=20)  # type: ignore[misc]
            suffix = [rng.randrange(1000, 30000) for _ in range(rng.choice([0, 0, 1, 7, 16, 40, 64]))]
            reply = client.post(cluster.listener_url + "/v1/completions",
                                json={"model": cluster.model, "prompt": prefix + suffix, "max_tokens": 1})  # fmt: skip
            reply.raise_for_status()
            served[reply.headers.get("x-mock-vllm-endpoint", "?")] = served.get(reply.headers.get("x-mock-vllm-endpoint", "?"), 0) + 1
            reported_total += reply.json()["usage"].get("prompt_tokens_details", {}).get("cached_tokens") or 0
    samples = _samples(cluster)
    bucket = "ppc_extproc_cached_tokens_error_tokens_bucket"
    exact = samples[(bucket, (("le", "0.0"),))] - samples[(bucket, (("le", "-1.0"),))]
    total = samples[("ppc_extproc_cached_tokens_error_tokens_count", ())]
    print(f"predicted == reported on {exact:.0f}/{total:.0f} probes; served by {served}")
    sizes = {k[1][0][1]: v for k, v in samples.items() if k[0] == "ppc_extproc_engine_block_size"}
    assert sorted(sizes.values()) == [16, 32, 64, 64], sizes
    assert reported_total > 0 and len(served) >= 3, served
    assert total >= PROBES, total
    assert exact / total >= 0.99, f"{exact:.0f}/{total:.0f} probes predicted exactly"
