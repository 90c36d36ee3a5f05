"""Pod → endpoints, the cases of llm-d's pod reconciler and datastore tests
(llm-d/llm-d-router: pkg/epp/controller/pod_reconciler_test.go, pkg/epp/datastore/datastore_test.go)."""

from __future__ import annotations

from typing import Any

import pytest

from ppc_extproc.discovery.kubernetes.pods import (
    PodParseError,
    active_ports,
    parse_pod,
    pod_endpoints,
)


def pod(name: str = "qwen-0", ip: str = "10.0.0.5", ready: str | None = "True", deleting: bool = False,
        labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "namespace": "llm", "uid": f"uid-{name}",
                                "labels": labels if labels is not None else {"app": "qwen"}}
    if annotations is not None:
        metadata["annotations"] = annotations
    if deleting:
        metadata["deletionTimestamp"] = "2026-08-01T00:00:00Z"
    conditions = [{"type": "Initialized", "status": "True"}]
    if ready is not None:
        conditions.append({"type": "Ready", "status": ready})
    return {"kind": "Pod", "metadata": metadata, "status": {"podIP": ip, "hostIP": "10.1.0.2", "conditions": conditions}}


def ids(obj: dict[str, Any], ports: tuple[int, ...] = (8000,)) -> list[tuple[str, int, str]]:
    return [(e.id, e.rank, e.name) for e in pod_endpoints(parse_pod(obj), ports)]


def test_ready_pod_gives_one_endpoint_per_target_port_ranked_in_order() -> None:
    assert ids(pod(), (8000, 8001)) == [
        ("10.0.0.5:8000", 0, "llm/qwen-0-rank-0"),
        ("10.0.0.5:8001", 1, "llm/qwen-0-rank-1"),
    ]
    endpoint = pod_endpoints(parse_pod(pod(labels={"app": "qwen", "llm-d.ai/role": "decode"})), (8000,))[0]
    assert endpoint.labels == (("app", "qwen"), ("llm-d.ai/role", "decode"))


@pytest.mark.parametrize(
    "obj",
    [
        pod(ready="False"),          # turned not ready
        pod(ready=None),             # no Ready condition yet (new pod)
        pod(ready="Unknown"),
        pod(deleting=True),          # deletionTimestamp set, even while Ready
        pod(ip=""),                  # scheduled, no IP yet
    ],
)
def test_pods_that_do_not_serve_give_nothing(obj: dict[str, Any]) -> None:
    assert ids(obj, (8000, 8001)) == []


def test_phase_and_container_statuses_are_not_consulted() -> None:
    obj = pod()
    obj["status"]["phase"] = "Pending"
    obj["status"]["containerStatuses"] = [{"ready": False}]
    assert ids(obj) == [("10.0.0.5:8000", 0, "llm/qwen-0-rank-0")]


def test_ipv6_pod_ip_is_normalised_and_unbracketed() -> None:
    assert ids(pod(ip="fd00:0::1")) == [("fd00::1:8000", 0, "llm/qwen-0-rank-0")]


@pytest.mark.parametrize(
    ("annotations", "expected"),
    [
        ({"llm-d.ai/active-ports": "8001"}, [("10.0.0.5:8001", 1)]),        # rank index kept
        ({"llm-d.ai/active-ports": " 8000 , 8002 "}, [("10.0.0.5:8000", 0), ("10.0.0.5:8002", 2)]),
        ({"llm-d.ai/active-ports": "9999,8001,x"}, [("10.0.0.5:8001", 1)]),  # unknown ports ignored
        ({"llm-d.ai/active-ports": ""}, []),                                 # empty set: no endpoints
        ({"inference.networking.k8s.io/active-ports": "8002"}, [("10.0.0.5:8002", 2)]),  # legacy key
        ({"llm-d.ai/active-ports": "8000", "inference.networking.k8s.io/active-ports": "8001"}, [("10.0.0.5:8000", 0)]),
    ],
)
def test_active_ports_annotation(annotations: dict[str, str], expected: list[tuple[str, int]]) -> None:
    endpoints = pod_endpoints(parse_pod(pod(annotations=annotations)), (8000, 8001, 8002))
    assert [(e.id, e.rank) for e in endpoints] == expected


def test_active_ports_without_annotation_is_every_target_port() -> None:
    assert active_ports(None, (8000, 8001)) == {8000, 8001}


def test_shrinking_target_ports_drops_the_orphan_rank() -> None:
    record = parse_pod(pod())
    assert [e.id for e in pod_endpoints(record, (8000, 8001))] == ["10.0.0.5:8000", "10.0.0.5:8001"]
    assert [e.id for e in pod_endpoints(record, (8000,))] == ["10.0.0.5:8000"]


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        ({"metadata": {}}, "metadata.name"),
        ({"metadata": {"name": "p", "labels": []}}, "metadata.labels"),
        ({"metadata": {"name": "p"}, "status": {"podIP": "not-an-ip"}}, "status.podIP"),
        ({"metadata": {"name": "p"}, "status": {"conditions": {}}}, "status.conditions"),
    ],
)
def test_unusable_pods_name_the_field(obj: dict[str, Any], message: str) -> None:
    with pytest.raises(PodParseError, match=message):
        parse_pod(obj)
