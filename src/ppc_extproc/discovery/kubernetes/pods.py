"""Pods → endpoints, by llm-d's rules.

A pod counts when its ``Ready`` condition is ``True`` and it has no ``deletionTimestamp``
(``llm-d/llm-d-router: pkg/epp/util/pod/pod.go`` ``IsPodReady``; phase and container statuses are
not consulted). A counted pod gives one endpoint per pool target port, ``podIP:targetPorts[i]``
with rank ``i`` (``pkg/epp/datastore/datastore.go`` ``podUpdateOrAddIfNotExist``). The
``llm-d.ai/active-ports`` annotation (legacy ``inference.networking.k8s.io/active-ports``) narrows
the ports, keeping each port's rank index; absent, every target port is active.

Only the fields these rules read are kept (``PodRecord``), so a cache of thousands of pods stays small.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ppc_extproc.framework import Endpoint

__all__ = [
    "ACTIVE_PORTS_ANNOTATION",
    "LEGACY_ACTIVE_PORTS_ANNOTATION",
    "PodParseError",
    "PodRecord",
    "active_ports",
    "endpoint_name",
    "parse_pod",
    "pod_endpoints",
]

ACTIVE_PORTS_ANNOTATION = "llm-d.ai/active-ports"
LEGACY_ACTIVE_PORTS_ANNOTATION = "inference.networking.k8s.io/active-ports"
_MAX_LABELS = 256


@dataclass(frozen=True, slots=True)
class PodRecord:
    """What discovery needs of a Pod object."""

    namespace: str
    name: str
    uid: str
    labels: tuple[tuple[str, str], ...]
    pod_ip: str
    #: ``status.conditions[type=Ready].status == "True"``.
    ready: bool
    #: ``metadata.deletionTimestamp`` is set.
    terminating: bool
    #: The active-ports annotation's raw value (llm-d key first, then the legacy key), or None.
    active_ports: str | None = None

    @property
    def serving(self) -> bool:
        """Ready and not terminating: the pod gets endpoints."""
        return self.ready and not self.terminating

    def label_map(self) -> dict[str, str]:
        return dict(self.labels)


class PodParseError(ValueError):
    """A Pod object lacking what discovery needs; the message names the field."""


def _mapping(value: Any, field: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise PodParseError(f"{field}: expected an object")
    return value


def parse_pod(obj: Mapping[str, Any]) -> PodRecord:
    """A Pod object (JSON as the API server sends it) → PodRecord. Raises PodParseError."""
    metadata = _mapping(obj.get("metadata"), "metadata")
    status = _mapping(obj.get("status"), "status")
    name = metadata.get("name")
    if not isinstance(name, str) or not name:
        raise PodParseError("metadata.name: missing")
    labels = _mapping(metadata.get("labels"), "metadata.labels")
    annotations = _mapping(metadata.get("annotations"), "metadata.annotations")
    ready = False
    conditions = status.get("conditions")
    conditions = [] if conditions is None else conditions
    if not isinstance(conditions, list):
        raise PodParseError("status.conditions: expected a list")
    for condition in conditions:
        if isinstance(condition, Mapping) and condition.get("type") == "Ready":
            ready = condition.get("status") == "True"
            break
    active = annotations.get(ACTIVE_PORTS_ANNOTATION, annotations.get(LEGACY_ACTIVE_PORTS_ANNOTATION))
    pod_ip = status.get("podIP") or ""
    if pod_ip:
        try:
            pod_ip = str(ipaddress.ip_address(str(pod_ip)))
        except ValueError:
            raise PodParseError(f"status.podIP: not an IP address: {pod_ip!r}") from None
    return PodRecord(
        namespace=str(metadata.get("namespace") or ""),
        name=name,
        uid=str(metadata.get("uid") or ""),
        labels=tuple(sorted((str(k), str(v)) for k, v in list(labels.items())[:_MAX_LABELS])),
        pod_ip=pod_ip,
        ready=ready,
        terminating=metadata.get("deletionTimestamp") is not None,
        active_ports=str(active) if active is not None else None,
    )


def active_ports(annotation: str | None, target_ports: Sequence[int]) -> set[int]:
    """Ports of ``target_ports`` the annotation lists (comma-separated, spaces allowed; entries that
    are not one of the target ports are ignored). No annotation: every target port."""
    if annotation is None:
        return set(target_ports)
    listed = set()
    for item in annotation.split(","):
        text = item.strip()
        if text.isdigit():
            listed.add(int(text))
    return listed & set(target_ports)


def endpoint_name(pod: PodRecord, rank: int) -> str:
    """llm-d's endpoint id, ``<namespace>/<pod>-rank-<i>``, kept as the endpoint's name."""
    return f"{pod.namespace}/{pod.name}-rank-{rank}"


def pod_endpoints(pod: PodRecord, target_ports: Sequence[int]) -> list[Endpoint]:
    """The endpoints a pod contributes: none unless it is serving and has an IP; otherwise one per
    active target port, ranked by the port's position in ``target_ports``."""
    if not pod.serving or not pod.pod_ip:
        return []
    active = active_ports(pod.active_ports, target_ports)
    return [
        Endpoint(pod.pod_ip, port, name=endpoint_name(pod, rank), rank=rank, labels=pod.labels)
        for rank, port in enumerate(target_ports)
        if port in active
    ]
