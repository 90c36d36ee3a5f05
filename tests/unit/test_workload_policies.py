"""Routing policies: every config loads with the service's loader; the round-robin picker rotates."""

from __future__ import annotations

import threading

import pytest
import yaml

from ppc_extproc.config.epp import load_config_text
from ppc_extproc.errors import ConfigError
from ppc_extproc.framework import Endpoint, LLMRequest, SchedulingContext
from ppc_extproc.plugins.pickers import RoundRobinPicker
from ppc_extproc.plugins.registry import registered_types
from ppc_extproc_lab.workload.policies import ALL_POLICIES, BENCHMARK_POLICIES, policy

ENDPOINTS = [Endpoint("10.0.0.3", 8000), Endpoint("10.0.0.1", 8000), Endpoint("10.0.0.2", 8000)]


def ctx() -> SchedulingContext:
    return SchedulingContext(LLMRequest("r", "m"), list(ENDPOINTS))


def test_round_robin_is_registered() -> None:
    assert "round-robin-picker" in registered_types()


def test_round_robin_cycles_in_endpoint_order_ignoring_scores() -> None:
    picker = RoundRobinPicker("rr")
    scored = [(e, float(i)) for i, e in enumerate(ENDPOINTS)]  # the last has the best score
    picks = [picker.pick(ctx(), scored)[0].address for _ in range(6)]
    assert picks == ["10.0.0.1", "10.0.0.2", "10.0.0.3"] * 2


def test_round_robin_several_endpoints_and_changing_candidates() -> None:
    picker = RoundRobinPicker("rr", max_endpoints=2)
    scored = [(e, 0.0) for e in ENDPOINTS]
    assert [e.address for e in picker.pick(ctx(), scored)] == ["10.0.0.1", "10.0.0.2"]
    assert [e.address for e in picker.pick(ctx(), scored)] == ["10.0.0.2", "10.0.0.3"]
    assert [e.address for e in picker.pick(ctx(), scored[:1])] == ["10.0.0.3"]
    assert picker.pick(ctx(), []) == []


def test_round_robin_is_even_under_threads() -> None:
    picker = RoundRobinPicker("rr")
    scored = [(e, 0.0) for e in ENDPOINTS]
    counts: dict[str, int] = {}
    lock = threading.Lock()

    def work() -> None:
        for _ in range(300):
            address = picker.pick(ctx(), scored)[0].address
            with lock:
                counts[address] = counts.get(address, 0) + 1

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert counts == {"10.0.0.1": 400, "10.0.0.2": 400, "10.0.0.3": 400}


def test_round_robin_parameters_are_strict() -> None:
    text = yaml.safe_dump({"plugins": [{"type": "round-robin-picker", "parameters": {"maxNumOfEndpoints": 2}}]})
    loaded = load_config_text(text)
    assert loaded.profiles["default"].picker.max_endpoints == 2
    bad = yaml.safe_dump({"plugins": [{"type": "round-robin-picker", "parameters": {"nope": 1}}]})
    with pytest.raises(ConfigError, match="nope"):
        load_config_text(bad)


@pytest.mark.parametrize("name", [n for n in ALL_POLICIES if policy(n).ours])
def test_every_policy_config_loads(name: str) -> None:
    chosen = policy(name, block_size=64)
    assert chosen.service_config is not None and not chosen.oracle
    loaded = load_config_text(yaml.safe_dump(dict(chosen.service_config)), source=name)
    assert loaded.profiles and all(p.picker is not None for p in loaded.profiles.values())


def test_policy_line_ups() -> None:
    assert policy("oracle").oracle and policy("oracle").service_config is None
    for name in ("vllm-router", "sglang-router", "vllm-router-kv"):
        chosen = policy(name)
        assert chosen.peer is not None and chosen.peer.name == name
        assert not chosen.oracle and not chosen.ours
    assert set(BENCHMARK_POLICIES) <= set(ALL_POLICIES)
    with pytest.raises(ValueError, match="unknown policy"):
        policy("nope")


def _weights(name: str) -> dict[str, float]:
    config = policy(name).service_config
    assert config is not None
    return {p["pluginRef"]: p.get("weight", 1) for p in config["schedulingProfiles"][0]["plugins"]}


def test_policy_contents() -> None:
    assert _weights("precise+load") == {
        "prefix-cache-scorer": 3, "kv-cache-utilization-scorer": 2, "queue-scorer": 2, "max-score-picker": 1,
    }  # fmt: skip
    assert _weights("round-robin") == {"round-robin-picker": 1}

    def speculative(name: str) -> bool:
        config = policy(name).service_config
        assert config is not None
        producer = next(p for p in config["plugins"] if p["type"] == "precise-prefix-cache-producer")
        return bool(producer["parameters"]["speculativeIndexing"])

    assert not speculative("precise") and speculative("precise+spec") and speculative("precise+load")
    approx = policy("approximate").service_config
    assert approx is not None
    scorer = next(p for p in approx["plugins"] if p["type"] == "prefix-cache-scorer")
    assert scorer["parameters"]["prefixMatchInfoProducerName"] == "approx-prefix-cache-producer"
