"""Resolve the ``flowControl`` section's plugin references, as llm-d's loader does
(``llm-d/llm-d-router: pkg/epp/config/loader/flowcontrol.go`` and ``defaults.go``).

The saturation detector (``flowControl.saturationDetector.pluginRef``, default
``utilization-detector``, injected when no plugin of that name exists) serves flow control and,
without the gate, llm-d's legacy admission (sheddable requests are rejected at saturation ≥ 1.0).
With the gate on, the band defaults ``global-strict-fairness-policy`` and ``fcfs-ordering-policy``
and the usage limit ``static-usage-limit-policy`` are injected when absent, and every band's
references must name a plugin of the right kind. Every ``probabilistic-admitter`` (any
``Admitter``) configured runs before flow control, gate or not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from ppc_extproc.errors import ConfigError
from ppc_extproc.flowcontrol.config import FlowControlSpec
from ppc_extproc.flowcontrol.controller import FlowPolicies
from ppc_extproc.flowcontrol.types import (
    Admitter,
    FairnessPolicy,
    OrderingPolicy,
    SaturationDetector,
    UsageLimitPolicy,
)
from ppc_extproc.framework import Plugin, plays

if TYPE_CHECKING:
    from ppc_extproc.config.epp import _Builder

__all__ = ["FlowControlPlan", "resolve_flow_control"]

DEFAULT_DETECTOR = "utilization-detector"
DEFAULT_FAIRNESS = "global-strict-fairness-policy"
DEFAULT_ORDERING = "fcfs-ordering-policy"
DEFAULT_USAGE_LIMIT = "static-usage-limit-policy"

_P = TypeVar("_P")


@dataclass(frozen=True, slots=True)
class FlowControlPlan:
    """What the service runs for admission and flow control."""

    #: The ``flowControl`` feature gate.
    enabled: bool
    spec: FlowControlSpec
    #: Resolved policies (None when the gate is off).
    policies: FlowPolicies | None
    #: The configured saturation detector (None: none named and the gate is off, so the legacy
    #: admission uses the built-in one).
    detector: SaturationDetector | None
    admitters: tuple[Admitter, ...] = ()


def _resolve(builder: _Builder, ref: str, role: type[_P], kind: str, path: str, default: str | None = None) -> _P:
    plugin: Plugin | None = builder.plugins.get(ref)
    if plugin is None and default is not None and ref == default:
        plugin = builder.inject(default, default, f"flow-control default {kind}")
    if plugin is None:
        raise ConfigError(path, f"plugin {ref!r} not found")
    if not plays(plugin, role):
        raise ConfigError(path, f"plugin {ref!r} (type: {plugin.type_name}) is not a {kind}")
    return plugin


def resolve_flow_control(builder: _Builder) -> FlowControlPlan:
    document = builder.document
    spec = document.flow_control or FlowControlSpec()
    enabled = document.feature_gates.get("flowControl", False)
    admitters = tuple(p for p in builder.plugins.values() if plays(p, Admitter))
    detector: SaturationDetector | None = None
    named = document.saturation_detector
    if named is not None or enabled:
        path, ref = named or ("flowControl.saturationDetector.pluginRef", DEFAULT_DETECTOR)
        if ref != DEFAULT_DETECTOR and ref not in builder.plugins:
            raise ConfigError(path, f"saturation detector references undefined plugin '{ref}'")
        detector = _resolve(builder, ref, SaturationDetector, "saturation detector", path, DEFAULT_DETECTOR)
    if not enabled:
        return FlowControlPlan(False, spec, None, detector, admitters)
    assert detector is not None
    fairness: dict[str, FairnessPolicy] = {}
    ordering: dict[str, OrderingPolicy] = {}
    default_fairness = _resolve(builder, DEFAULT_FAIRNESS, FairnessPolicy, "fairness policy", "flowControl",
                                DEFAULT_FAIRNESS)  # fmt: skip
    default_ordering = _resolve(builder, DEFAULT_ORDERING, OrderingPolicy, "ordering policy", "flowControl",
                                DEFAULT_ORDERING)  # fmt: skip
    for band in spec.band_paths():
        if band.fairness_ref:
            fairness[band.fairness_ref] = _resolve(builder, band.fairness_ref, FairnessPolicy, "fairness policy",
                                                   f"{band.path}.fairnessPolicyRef")  # fmt: skip
        if band.ordering_ref:
            ordering[band.ordering_ref] = _resolve(builder, band.ordering_ref, OrderingPolicy, "ordering policy",
                                                   f"{band.path}.orderingPolicyRef")  # fmt: skip
    usage_ref = spec.usage_limit_ref or DEFAULT_USAGE_LIMIT
    usage = _resolve(builder, usage_ref, UsageLimitPolicy, "usage limit policy", spec.usage_limit_path,
                     DEFAULT_USAGE_LIMIT)  # fmt: skip
    policies = FlowPolicies(detector, usage, fairness, ordering, default_fairness, default_ordering)
    return FlowControlPlan(True, spec, policies, detector, admitters)
