"""A loaded configuration as text: the resolved pipeline, what was injected, the warnings."""

from __future__ import annotations

from ppc_extproc.config.epp import LoadedConfig
from ppc_extproc.framework import Plugin
from ppc_extproc.plugins.producers.token_producer import TokenProducer
from ppc_extproc.scheduling.router import AsyncProducerStep

__all__ = ["describe_config"]


def _name(plugin: Plugin, loaded: LoadedConfig) -> str:
    label = plugin.name if plugin.name == plugin.type_name else f"{plugin.name} ({plugin.type_name})"
    if isinstance(plugin, TokenProducer):
        label += f" [{plugin.backend_name} backend]"
    return label + (" [injected]" if loaded.paths.get(plugin.name) == "(injected)" else "")


def describe_config(loaded: LoadedConfig) -> list[str]:
    """Lines describing ``loaded``, for ``ppc-extproc check-config``."""
    lines = [f"profile handler: {_name(loaded.handler, loaded)}"]
    for profile in loaded.profiles.values():
        lines.append(f"profile {profile.name}:")
        lines.append(f"  filters: {', '.join(_name(f, loaded) for f in profile.filters) or '-'}")
        scorers = ", ".join(f"{_name(w.scorer, loaded)} ×{w.weight:g}" for w in profile.scorers)
        lines.append(f"  scorers: {scorers or '-'}")
        lines.append(f"  picker:  {_name(profile.picker, loaded)}")
    steps = []
    for step in loaded.pipeline.producers:
        suffix = " (async)" if isinstance(step, AsyncProducerStep) else ""
        steps.append(_name(step.producer, loaded) + suffix)
    lines.append(f"producers, in run order: {' → '.join(steps) or '-'}")
    layer = loaded.data_layer
    sources = [f"{s.name} → [{', '.join(e.name for e in s.extractors)}]" for s in layer.endpoint_sources]
    sources += [f"{s.name} → [{', '.join(e.name for e in s.extractors)}]" for s in layer.polling_sources]
    lines.append("data sources: " + ("; ".join(sources) if sources else "-"))
    if loaded.discovery is not None:
        lines.append(f"discovery: {_name(loaded.discovery, loaded)}")
    if loaded.pipeline.parsers is not None:
        lines.append(f"request parsers: {', '.join(p.name for p in loaded.pipeline.parsers)}")
    gates = ", ".join(f"{k}={str(v).lower()}" for k, v in loaded.feature_gates.items())
    lines.append(f"feature gates: {gates}")
    lines.extend(_flow_control(loaded))
    if loaded.injected:
        lines.append("injected defaults:")
        lines.extend(f"  - {line}" for line in loaded.injected)
    if loaded.warnings:
        lines.append("warnings:")
        lines.extend(f"  - {line}" for line in loaded.warnings)
    return lines


def _flow_control(loaded: LoadedConfig) -> list[str]:
    """Admission and flow control, when configured: what runs before scheduling."""
    plan = loaded.flow_control
    if plan is None or not (plan.enabled or plan.admitters or plan.detector is not None):
        return []
    lines = []
    if plan.admitters:
        lines.append(f"admitters: {', '.join(a.name for a in plan.admitters)}")
    if plan.policies is None:
        if plan.detector is not None:
            lines.append(f"legacy admission: sheddable requests rejected at saturation >= 1.0 ({plan.detector.name})")
        return lines
    p, spec = plan.policies, plan.spec
    bands = ", ".join(f"{b.priority} (max {b.max_requests} requests)" for b in spec.bands) or "-"
    band = spec.band_for(0)
    lines.append(
        f"flow control: detector {p.detector.name}, usage limit {p.usage_limit.name}, default band fairness "
        f"{band.fairness_ref or p.default_fairness.name}, ordering {band.ordering_ref or p.default_ordering.name}; "
        f"configured bands {bands}; TTL {spec.default_ttl:g}s; "
        f"in-flight credit {'on' if spec.inflight_credit else 'off'}; band starvation limit "
        f"{spec.band_starvation_limit or 'off (strict priority)'}"
    )
    return lines
