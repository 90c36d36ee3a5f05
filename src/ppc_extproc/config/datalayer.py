"""``dataLayer.sources``: which sources feed which extractors, validated with llm-d's rules.

    endpoint-notification-source → endpoint extractors (e.g. precise-prefix-cache-producer)
    metrics-data-source          → metrics extractors (core-metrics-extractor)

Rules (``llm-d/llm-d-router: pkg/epp/config/loader/configloader.go``, ``pkg/epp/datalayer/runtime.go``):
every source is a data source, every extractor exists and fits its source's kind, one type at most
once per source. An endpoint extractor no source lists still receives endpoint events through a
source added here (llm-d would leave it without — that difference is logged once).

Sources are planned first (``SourcePlan``: type, parameters, extractors) and built last
(``build_sources``), complete, once every plugin they feed or read exists.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from ppc_extproc.config.document import SourceSpec
from ppc_extproc.errors import ConfigError
from ppc_extproc.framework import (
    IN_FLIGHT_LOAD,
    EndpointEvent,
    EndpointExtractor,
    EndpointSource,
    InFlightLoad,
    MetricsExtractor,
    Plugin,
    PollingSource,
    plays,
    role_names,
)
from ppc_extproc.framework.params import Section
from ppc_extproc.plugins.registry import Services, SourceFactory, SourceWiring, create_source

__all__ = ["DataLayer", "SourcePlan", "SourcesPlan", "build_sources", "wire_sources"]


@dataclass
class SourcePlan:
    """A data source to build once the plugins it feeds exist (sources are built complete)."""

    name: str
    factory: type[SourceFactory]
    params: Section
    #: ``plugins[i]``, or ``(injected)``.
    path: str
    extractors: list[Plugin] = field(default_factory=list)

    @property
    def type_name(self) -> str:
        return self.factory.type_name

    @property
    def polling(self) -> bool:
        return PollingSource in self.factory.__mro__

    def add(self, extractor: Plugin) -> None:
        if extractor not in self.extractors:
            self.extractors.append(extractor)


@dataclass
class SourcesPlan:
    """``dataLayer.sources`` as planned: which source feeds which extractors, before any is built."""

    endpoint_sources: list[SourcePlan] = field(default_factory=list)
    polling_sources: list[SourcePlan] = field(default_factory=list)

    def metrics_extractors(self) -> list[Plugin]:
        """Metrics extractors that some polling source feeds."""
        found: list[Plugin] = []
        for source in self.polling_sources:
            for extractor in source.extractors:
                if extractor not in found:
                    found.append(extractor)
        return found

    def listed(self, plan: SourcePlan) -> bool:
        return plan in self.endpoint_sources or plan in self.polling_sources

    def add(self, plan: SourcePlan) -> None:
        group = self.polling_sources if plan.polling else self.endpoint_sources
        if plan not in group:
            group.append(plan)


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


def wire_sources(
    specs: tuple[SourceSpec, ...], plugins: Mapping[str, Plugin], sources: Mapping[str, SourcePlan]
) -> SourcesPlan:
    """Plan each listed source's extractors; raises ``ConfigError`` naming the field."""
    layer = SourcesPlan()
    for spec in specs:
        source = sources.get(spec.plugin_ref)
        if source is None:
            if spec.plugin_ref in plugins:
                raise ConfigError(f"{spec.path}.pluginRef", f"the plugin {spec.plugin_ref} is not a data source")
            raise ConfigError(f"{spec.path}.pluginRef", f"the plugin {spec.plugin_ref} is not registered")
        extractors: list[Plugin] = []
        for path, ref in spec.extractors:
            extractor = plugins.get(ref)
            if extractor is None:
                raise ConfigError(f"{path}.pluginRef", f"the plugin {ref} is not registered")
            extractors.append(extractor)
        _check_unique_types(spec, extractors)
        for (path, ref), extractor in zip(spec.extractors, extractors):
            if not source.polling and not plays(extractor, EndpointExtractor):
                raise ConfigError(
                    f"{path}.pluginRef",
                    f"endpoint source {spec.plugin_ref} requires an EndpointExtractor; extractor {ref} "
                    f"does not implement it (it is a {', '.join(role_names(extractor)) or 'plugin'})",
                )
            if source.polling and not plays(extractor, MetricsExtractor):
                raise ConfigError(
                    f"{path}.pluginRef",
                    f"polling source {spec.plugin_ref} requires a metrics extractor; {ref} is not one",
                )
            source.add(extractor)
        layer.add(source)
    return layer


def build_sources(
    layer: SourcesPlan, named: Iterable[SourcePlan], services: Services, in_flight: InFlightLoad | None
) -> tuple[DataLayer, dict[str, Plugin]]:
    """Build every planned source once, with its extractors and (when its type declares
    ``InFlightLoadDataKey``) the in-flight view: the wired data layer, and the named sources built
    (``named``: the configured and injected ones; an implicit source has no name in the document)."""
    built: dict[int, Plugin] = {}
    by_name: dict[str, Plugin] = {}
    named = list(named)
    for plan in (*named, *layer.endpoint_sources, *layer.polling_sources):
        if id(plan) in built:
            continue
        reads_load = any(need.data_type == IN_FLIGHT_LOAD for need in plan.factory.source_consumes)
        wiring = SourceWiring(tuple(plan.extractors), in_flight if reads_load else None)
        built[id(plan)] = create_source(plan.type_name, plan.name, plan.params, services, wiring)
    for plan in named:
        by_name[plan.name] = built[id(plan)]
    data = DataLayer()
    for plan in layer.endpoint_sources:
        endpoint_source = built[id(plan)]
        assert plays(endpoint_source, EndpointSource)
        data.endpoint_sources.append(endpoint_source)
    for plan in layer.polling_sources:
        polling_source = built[id(plan)]
        assert plays(polling_source, PollingSource)
        data.polling_sources.append(polling_source)
    return data, by_name
