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
    if loaded.injected:
        lines.append("injected defaults:")
        lines.extend(f"  - {line}" for line in loaded.injected)
    if loaded.warnings:
        lines.append("warnings:")
        lines.extend(f"  - {line}" for line in loaded.warnings)
    return lines
