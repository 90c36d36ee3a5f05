"""InferencePool v1 parsing, the v1alpha2 mapping, and their validation errors."""

from __future__ import annotations

from typing import Any

import pytest

from ppc_extproc.discovery.kubernetes.pool import (
    POOL_GROUP_V1ALPHA2,
    PoolParseError,
    parse_inference_pool,
    validate_target_ports,
)
from ppc_extproc.discovery.kubernetes.selector import LabelSelector

V1 = {
    "apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
    "metadata": {"name": "qwen-pool", "namespace": "llm"},
    "spec": {"selector": {"matchLabels": {"app": "qwen-pool"}}, "targetPorts": [{"number": 8000}, {"number": 8001}],
             "appProtocol": "http", "endpointPickerRef": {"name": "qwen-epp", "port": {"number": 9002}}},
}


def test_v1_pool() -> None:
    spec = parse_inference_pool(V1)
    assert (spec.namespace, spec.name, spec.target_ports, spec.app_protocol, spec.deleting) == (
        "llm", "qwen-pool", (8000, 8001), "http", False)
    assert spec.selector == LabelSelector.parse("app=qwen-pool")


def test_v1alpha2_maps_selector_and_target_port_number() -> None:
    obj = {"metadata": {"name": "p", "namespace": "llm", "deletionTimestamp": "2026-01-01T00:00:00Z"},
           "spec": {"selector": {"app": "x"}, "targetPortNumber": 8000, "extensionRef": {"name": "epp"}}}
    spec = parse_inference_pool(obj, POOL_GROUP_V1ALPHA2)
    assert (spec.selector.render(), spec.target_ports, spec.deleting) == ("app=x", (8000,), True)


def _with_spec(**changes: Any) -> dict[str, Any]:
    return {**V1, "spec": {**V1["spec"], **changes}}


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        ({"metadata": {"name": "p"}}, "spec: missing"),
        (_with_spec(selector={"matchLabels": {}}), "spec.selector.matchLabels: expected 1-64 labels"),
        (_with_spec(selector={"matchLabels": {"bad key": "x"}}), "invalid label key"),
        (_with_spec(targetPorts=[]), "spec.targetPorts: should have length from 1 to 8, got 0"),
        (_with_spec(targetPorts=[{"number": p} for p in range(8000, 8009)]), "length from 1 to 8, got 9"),
        (_with_spec(targetPorts=[{"number": 8000}, {"number": 8000}]), "spec.targetPorts[1]: duplicate port 8000"),
        (_with_spec(targetPorts=[{"number": 0}]), "spec.targetPorts[0]: expected a port number"),
    ],
)
def test_invalid_pools_name_the_field(obj: dict[str, Any], message: str) -> None:
    with pytest.raises(PoolParseError) as info:
        parse_inference_pool(obj)
    assert message in str(info.value)


def test_flag_ports_drop_duplicates_in_order() -> None:
    assert validate_target_ports([8001, 8000, 8001], "--endpoint-target-ports", dedupe=True) == (8001, 8000)
