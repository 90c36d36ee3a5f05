"""llm-d's five P/D sample configs (``pd-epp-config``, ``sim-pd-epp-config``,
``pd-topology-epp-config``, ``sim-e-p-d-epp-config``, ``sim-e-pd-epp-config``, as restated in
``tests/unit/config/test_llmd_sample_configs.py``) each serve the P/D lab through real Envoy: the
config passes ``check-config`` with the lab's labelled file discovery, a long uncached prompt is
disaggregated through a prefill engine when the config has a prefill decider, a short one is not,
and every answer comes from the decode pod.
"""

from __future__ import annotations

import importlib.util
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from ppc_extproc_lab.localcluster import LocalCluster

pytestmark = pytest.mark.integration

_SAMPLES_PATH = Path(__file__).parents[1] / "unit" / "config" / "test_llmd_sample_configs.py"
PD_SAMPLES = ("pd-epp-config", "sim-pd-epp-config", "pd-topology-epp-config", "sim-e-p-d-epp-config",
              "sim-e-pd-epp-config")
FAST_ENGINES = ["--prefill-tokens-per-s", "400000", "--decode-ms-per-token", "1"]


def sample(name: str) -> dict[str, Any]:
    spec = importlib.util.spec_from_file_location("llmd_sample_configs", _SAMPLES_PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config: dict[str, Any] = yaml.safe_load(module.LOADABLE[name])
    return config


def prompt(seed: int, length: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1, 150_000) for _ in range(length)]


@pytest.mark.parametrize("name", PD_SAMPLES)
def test_sample_config_serves_the_pd_lab(name: str) -> None:
    config = sample(name)
    has_prefill_decider = any(p.get("type") == "prefix-based-pd-decider" for p in config["plugins"])
    roles = ["prefill", "prefill", "decode", *(["encode"] if name.startswith("sim-e-") else [])]
    with LocalCluster(num_engines=len(roles), roles=roles, block_size=16, num_blocks=2048,
                      engine_args=FAST_ENGINES, service_config=config) as cluster:
        assert cluster.service_config_path is not None
        checked = subprocess.run([sys.executable, "-m", "ppc_extproc", "check-config", str(cluster.service_config_path)],
                                 capture_output=True, text=True, timeout=60)
        assert checked.returncode == 0, checked.stdout + checked.stderr
        decode = cluster.engine_endpoints[cluster.indices("decode")[0]]
        prefill = {cluster.engine_endpoints[i] for i in cluster.indices("prefill")}
        legs = []
        for seed, length in ((1, 300), (2, 8), (3, 400)):
            rid = f"{name}-{seed}"
            r = httpx.post(cluster.listener_url + "/v1/completions", headers={"x-request-id": rid}, timeout=30,
                           json={"model": "mock-model", "prompt": prompt(seed, length), "max_tokens": 4})
            assert r.status_code == 200, r.text
            assert r.headers["x-mock-vllm-endpoint"] == decode
            legs.append(r.headers.get("x-mock-vllm-kv-transfer"))
        log = {e["x_request_id"]: e for e in httpx.get(cluster.engine_urls[cluster.indices("decode")[0]]
                                                          + "/sidecar/requests").json()}
    if has_prefill_decider:
        assert legs == ["decode", None, "decode"]  # long: P/D; 8 tokens < nonCachedTokens 16: not
        assert {log[f"{name}-{s}"]["header"] for s in (1, 3)} <= prefill
    else:  # encode and decode only: text is decoded where it lands
        assert legs == [None, None, None]
    assert log[f"{name}-2"]["header"] is None
