"""InferencePool objects → the pool spec discovery works from (selector, target ports).

``inference.networking.k8s.io/v1`` (``kubernetes-sigs/gateway-api-inference-extension:
api/v1/inferencepool_types.go``): ``spec.selector.matchLabels`` (1–64 equality labels),
``spec.targetPorts[].number`` (1–8 unique ports; list index = data-parallel rank),
``spec.appProtocol``. The removed ``inference.networking.x-k8s.io/v1alpha2``
(``apix/v1alpha2/inferencepool_types.go``) maps ``spec.selector`` (a plain map) to
``matchLabels`` and ``spec.targetPortNumber`` to one target port.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ppc_extproc.discovery.kubernetes.selector import LabelSelector, SelectorError

__all__ = [
    "POOL_GROUP_V1",
    "POOL_GROUP_V1ALPHA2",
    "PoolParseError",
    "PoolSpec",
    "parse_inference_pool",
    "validate_target_ports",
]

POOL_GROUP_V1 = "inference.networking.k8s.io"
POOL_GROUP_V1ALPHA2 = "inference.networking.x-k8s.io"
#: Group → the version discovery reads.
POOL_VERSIONS = {POOL_GROUP_V1: "v1", POOL_GROUP_V1ALPHA2: "v1alpha2"}
MAX_TARGET_PORTS = 8
MAX_MATCH_LABELS = 64


class PoolParseError(ValueError):
    """An InferencePool (or flag set) that cannot be used; the message names the field."""


@dataclass(frozen=True, slots=True)
class PoolSpec:
    """What selects the pool's endpoints: which pods, and which ports (in rank order)."""

    namespace: str
    name: str
    selector: LabelSelector
    target_ports: tuple[int, ...]
    app_protocol: str = ""
    #: ``metadata.deletionTimestamp`` is set: the pool counts as gone (llm-d clears its endpoints).
    deleting: bool = False


def validate_target_ports(ports: Sequence[Any], field: str, *, dedupe: bool = False) -> tuple[int, ...]:
    """1–8 ports in 1..65535, order kept. ``dedupe`` drops repeats (llm-d's flag handling);
    otherwise a repeat is an error (the CRD requires unique ports)."""
    out: list[int] = []
    for i, raw in enumerate(ports):
        if isinstance(raw, bool) or not isinstance(raw, int) or not 0 < raw < 65536:
            raise PoolParseError(f"{field}[{i}]: expected a port number 1-65535, got {raw!r}")
        if raw in out:
            if dedupe:
                continue
            raise PoolParseError(f"{field}[{i}]: duplicate port {raw}")
        out.append(raw)
    if not 1 <= len(out) <= MAX_TARGET_PORTS:
        raise PoolParseError(f"{field}: should have length from 1 to {MAX_TARGET_PORTS}, got {len(out)}")
    return tuple(out)


def _match_labels(value: Any, field: str) -> LabelSelector:
    if not isinstance(value, Mapping) or not value:
        raise PoolParseError(f"{field}: expected 1-{MAX_MATCH_LABELS} labels")
    if len(value) > MAX_MATCH_LABELS:
        raise PoolParseError(f"{field}: more than {MAX_MATCH_LABELS} labels")
    try:
        return LabelSelector.from_match_labels({str(k): str(v) for k, v in value.items()})
    except SelectorError as exc:
        raise PoolParseError(f"{field}: {exc}") from None


def parse_inference_pool(obj: Mapping[str, Any], group: str = POOL_GROUP_V1) -> PoolSpec:
    """An InferencePool object of ``group``'s version → PoolSpec. Raises PoolParseError."""
    metadata = obj.get("metadata") or {}
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        raise PoolParseError("spec: missing")
    namespace, name = str(metadata.get("namespace") or ""), str(metadata.get("name") or "")
    deleting = metadata.get("deletionTimestamp") is not None
    if group == POOL_GROUP_V1ALPHA2:
        selector = _match_labels(spec.get("selector"), "spec.selector")
        ports = validate_target_ports([spec.get("targetPortNumber")], "spec.targetPortNumber")
        return PoolSpec(namespace, name, selector, ports, deleting=deleting)
    raw_selector = spec.get("selector")
    if not isinstance(raw_selector, Mapping):
        raise PoolParseError("spec.selector: missing")
    selector = _match_labels(raw_selector.get("matchLabels"), "spec.selector.matchLabels")
    raw_ports = spec.get("targetPorts")
    if not isinstance(raw_ports, list):
        raise PoolParseError("spec.targetPorts: expected a list of {number: port}")
    numbers = [p.get("number") if isinstance(p, Mapping) else p for p in raw_ports]
    ports = validate_target_ports(numbers, "spec.targetPorts")
    return PoolSpec(namespace, name, selector, ports, str(spec.get("appProtocol") or ""), deleting)
