"""``dataLayer.sources``: which sources feed which extractors, validated with llm-d's rules.

    endpoint-notification-source → endpoint extractors (e.g. precise-prefix-cache-producer)
    metrics-data-source          → metrics extractors (core-metrics-extractor)

Rules (``llm-d/llm-d-router: pkg/epp/config/loader/configloader.go``, ``pkg/epp/datalayer/runtime.go``):
every source is a data source, every extractor exists and fits its source's kind, one type at most
once per source. An endpoint extractor no source lists still receives endpoint events through a
source added here (llm-d would leave it without — that difference is logged once).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ppc_extproc.config.document import SourceSpec
from ppc_extproc.errors import ConfigError
from ppc_extproc.framework import (
    EndpointEvent,
    EndpointExtractor,
    EndpointSource,
    MetricsExtractor,
    Plugin,
    PollingSource,
    plays,
    role_names,
)

__all__ = ["DataLayer", "wire_sources"]


@dataclass
class DataLayer:
    """The wired sources; the endpoint pool notifies each of every endpoint change."""

    endpoint_sources: list[EndpointSource] = field(default_factory=list)
    polling_sources: list[PollingSource] = field(default_factory=list)

    def notify(self, event: EndpointEvent) -> None:
        for endpoint_source in self.endpoint_sources:
            endpoint_source.on_endpoint_event(event)
        for polling_source in self.polling_sources:
            polling_source.on_endpoint_event(event)

    def metrics_extractors(self) -> list[MetricsExtractor]:
        """Metrics extractors that some polling source feeds."""
        found: list[MetricsExtractor] = []
        for source in self.polling_sources:
            for extractor in source.extractors:
                if extractor not in found:
                    found.append(extractor)
        return found


def _check_unique_types(spec: SourceSpec, extractors: list[Plugin]) -> None:
    seen: dict[str, str] = {}
    for (path, ref), extractor in zip(spec.extractors, extractors):
        if extractor.type_name in seen:
            raise ConfigError(
                path, f"source {spec.plugin_ref} lists two extractors of type {extractor.type_name} "
                f"('{seen[extractor.type_name]}' and '{ref}')",
            )
        seen[extractor.type_name] = ref


def wire_sources(specs: tuple[SourceSpec, ...], plugins: Mapping[str, Plugin]) -> DataLayer:
    """Attach each listed source's extractors; raises ``ConfigError`` naming the field."""
    layer = DataLayer()
    for spec in specs:
        source = plugins.get(spec.plugin_ref)
        if source is None:
            raise ConfigError(f"{spec.path}.pluginRef", f"the plugin {spec.plugin_ref} is not registered")
        extractors: list[Plugin] = []
        for path, ref in spec.extractors:
            extractor = plugins.get(ref)
            if extractor is None:
                raise ConfigError(f"{path}.pluginRef", f"the plugin {ref} is not registered")
            extractors.append(extractor)
        _check_unique_types(spec, extractors)
        if plays(source, EndpointSource):
            endpoint_extractors: list[EndpointExtractor] = []
            for (path, ref), extractor in zip(spec.extractors, extractors):
                if not plays(extractor, EndpointExtractor):
                    raise ConfigError(
                        f"{path}.pluginRef",
                        f"endpoint source {spec.plugin_ref} requires an EndpointExtractor; extractor {ref} "
                        f"does not implement it (it is a {', '.join(role_names(extractor)) or 'plugin'})",
                    )
                endpoint_extractors.append(extractor)
            source.attach(endpoint_extractors)
            if source not in layer.endpoint_sources:
                layer.endpoint_sources.append(source)
        elif plays(source, PollingSource):
            metrics_extractors: list[MetricsExtractor] = []
            for (path, ref), extractor in zip(spec.extractors, extractors):
                if not plays(extractor, MetricsExtractor):
                    raise ConfigError(
                        f"{path}.pluginRef",
                        f"polling source {spec.plugin_ref} requires a metrics extractor; {ref} is not one",
                    )
                metrics_extractors.append(extractor)
            source.attach(metrics_extractors)
            if source not in layer.polling_sources:
                layer.polling_sources.append(source)
        else:
            raise ConfigError(f"{spec.path}.pluginRef", f"the plugin {spec.plugin_ref} is not a data source")
    return layer
