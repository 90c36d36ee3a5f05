"""Load an ``EndpointPickerConfig`` (llm-d's YAML shape) into typed plugins and a pipeline.

    apiVersion: llm-d.ai/v1alpha1
    kind: EndpointPickerConfig
    featureGates: [...]
    plugins: [{type, name?, parameters?}]
    schedulingProfiles: [{name, plugins: [{pluginRef, weight?}]}]
    dataLayer: {injectDefaults?, sources: [{pluginRef, extractors: [{pluginRef}]}], discovery: {pluginRef}}
    requestHandler: {parsers: [{pluginRef}]}

The sequence is llm-d's (``llm-d/llm-d-router: pkg/epp/config/loader/``): decode strictly, resolve
deprecated aliases, build the plugins (independent of their YAML order), classify each once by the
roles it declares, assemble profiles (one ``default`` profile when none is given), inject the
profile handler and picker, create the default producers of data nobody produces (a metrics
source for a plugin that reads engine metrics), order the producers by what they consume, and
build the data sources last, each with the extractors it feeds and the views it reads. What was injected is recorded for
``ppc-extproc check-config``. Every error names the field's path.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import structlog

from ppc_extproc.config.datalayer import DataLayer, SourcePlan, SourcesPlan, build_sources, wire_sources
from ppc_extproc.config.document import ConfigDocument, PluginSpec, parse_document
from ppc_extproc.config.flowcontrol import FlowControlPlan, resolve_flow_control
from ppc_extproc.config.producers import order_producers, resolve_producers
from ppc_extproc.errors import ConfigError
from ppc_extproc.framework import (
    CrossReplicaSyncer,
    Discovery,
    EndpointExtractor,
    Filter,
    Picker,
    Plugin,
    PluginRoles,
    ProfileHandler,
    RequestParser,
    Scorer,
    plays,
    role_names,
)
from ppc_extproc.framework.params import Section
from ppc_extproc.plugins.parsers import DEFAULT_PARSERS
from ppc_extproc.plugins.producers.inflight_load import INFLIGHT_LOAD_PRODUCER, InflightLoadProducer
from ppc_extproc.plugins.producers.precise_prefix_cache import PrecisePrefixCacheProducer
from ppc_extproc.plugins.registry import (
    Services,
    SourceFactory,
    create_plugin,
    source_factory,
)
from ppc_extproc.plugins.scorers.session_affinity import SessionAffinityScorer
from ppc_extproc.scheduling.profile import SchedulingProfile, WeightedScorer
from ppc_extproc.scheduling.router import Pipeline
from ppc_extproc.scheduling.scheduler import Scheduler

__all__ = ["LoadedConfig", "default_config_text", "load_config", "load_config_text"]

log = structlog.get_logger(__name__)

PRECISE_PRODUCER = "precise-prefix-cache-producer"
DEPRECATED_PRECISE_SCORER = "precise-prefix-cache-scorer"


@dataclass
class LoadedConfig:
    """Plugins built from a configuration, classified by role and assembled into a pipeline."""

    source: str
    #: Every plugin by name, injected ones included.
    plugins: dict[str, Plugin]
    roles: PluginRoles
    pipeline: Pipeline
    profiles: dict[str, SchedulingProfile]
    handler: ProfileHandler
    data_layer: DataLayer
    #: The discovery plugin (``dataLayer.discovery``), if any.
    discovery: Discovery | None
    services: Services
    feature_gates: dict[str, bool]
    warnings: list[str] = field(default_factory=list)
    #: What the loader added, one line each (``check-config`` prints them).
    injected: list[str] = field(default_factory=list)
    #: plugin name → its path in the document (``plugins[i]``; injected: ``(injected)``)
    paths: dict[str, str] = field(default_factory=dict)
    #: Admission and flow control (``flowControl`` and its feature gate).
    flow_control: FlowControlPlan | None = None


def default_config_text() -> str:
    return resources.files("ppc_extproc.config").joinpath("default.yaml").read_text()


def load_config(path: str | Path | None, services: Services | None = None) -> LoadedConfig:
    """Load a configuration file, or the embedded default when ``path`` is None."""
    if path is None:
        return load_config_text(default_config_text(), "<default>", services)
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError("", f"cannot read config file {path}: {exc.strerror or exc}") from None
    return load_config_text(text, str(path), services)


class _Builder:
    """The load sequence over one decoded document."""

    def __init__(self, document: ConfigDocument, services: Services) -> None:
        self.document = document
        self.services = services
        self.plugins: dict[str, Plugin] = {}
        #: Every plugin classified once, as it is added (injected ones included).
        self.roles = PluginRoles()
        #: Data sources by name: built last (``build_sources``), with their extractors.
        self.sources: dict[str, SourcePlan] = {}
        self.paths: dict[str, str] = {}
        self.injected: list[str] = []
        self.warnings = document.warnings

    def add(self, name: str, plugin: Plugin, path: str) -> None:
        self.plugins[name] = plugin
        self.paths[name] = path
        self.roles.add(plugin)

    def inject(self, type_name: str, name: str, why: str) -> Plugin:
        """Create a plugin with default parameters and record why (the injection note says it all:
        what its factory would warn about a configured one is not repeated)."""
        plugin = create_plugin(type_name, name, Section({}, f"({type_name})", type_name, []), self.services)
        self.add(name, plugin, "(injected)")
        self.injected.append(f"{type_name} '{name}': {why}")
        return plugin

    def inject_source(self, type_name: str, name: str, why: str) -> SourcePlan:
        factory = source_factory(type_name)
        assert factory is not None, type_name
        plan = SourcePlan(name, factory, Section({}, f"({type_name})", type_name, []), "(injected)")
        self.sources[name] = plan
        self.paths[name] = "(injected)"
        self.injected.append(f"{type_name} '{name}': {why}")
        return plan

    # --- plugins ----------------------------------------------------------------------------------

    def build_plugins(self) -> None:
        specs = self.document.plugins
        precise = [s for s in specs if s.type_name == PRECISE_PRODUCER]
        for spec in specs:
            if spec.type_name == DEPRECATED_PRECISE_SCORER:
                self._deprecated_precise_scorer(spec, precise)
                continue
            factory = source_factory(spec.type_name)
            if factory is not None:
                self.sources[spec.name] = SourcePlan(spec.name, factory, spec.params, spec.path)
                self.paths[spec.name] = spec.path
                continue
            self.add(spec.name, create_plugin(spec.type_name, spec.name, spec.params, self.services,
                                              path=f"{spec.path}.type"), spec.path)  # fmt: skip

    def _deprecated_precise_scorer(self, spec: PluginSpec, precise: list[PluginSpec]) -> None:
        """llm-d's legacy scorer: a prefix-cache-scorer over the one precise producer, or (none
        configured) a producer and scorer in one plugin under its own name."""
        spec.params.warn("", f"DEPRECATION: plugin type '{DEPRECATED_PRECISE_SCORER}' is deprecated; use "
                             f"{PRECISE_PRODUCER} + prefix-cache-scorer")  # fmt: skip
        if len(precise) > 1:
            raise ConfigError(
                f"{spec.path}.type",
                f"multiple {PRECISE_PRODUCER} instances configured ({', '.join(s.name for s in precise)}); "
                f"{DEPRECATED_PRECISE_SCORER} cannot tell which one to read",
            )
        if precise:
            spec.params.data.clear()  # its own parameters are ignored, as in llm-d
            params = Section({"prefixMatchInfoProducerName": precise[0].name}, spec.params.path,
                             "prefix-cache-scorer", self.warnings)  # fmt: skip
            self.add(spec.name, create_plugin("prefix-cache-scorer", spec.name, params, self.services), spec.path)
        else:
            self.add(spec.name, create_plugin(DEPRECATED_PRECISE_SCORER, spec.name, spec.params, self.services),
                     spec.path)  # fmt: skip

    # --- profiles, handler, picker ------------------------------------------------------------------

    def build_profiles(self, roles: PluginRoles) -> dict[str, SchedulingProfile]:
        profiles: dict[str, SchedulingProfile] = {}
        specs = self.document.profiles
        if not specs:  # llm-d: every filter, scorer and picker in one profile "default"
            chosen = {id(p) for p in (*roles.filters, *roles.scorers, *roles.pickers)}
            every: list[tuple[str, Plugin, float | None]] = [
                (self.paths[p.name], p, None) for p in self.plugins.values() if id(p) in chosen
            ]
            profiles["default"] = self._profile("default", every, roles)
            self.injected.append(f"profile 'default': no schedulingProfiles; holds {', '.join(p.name for _, p, _ in every)}")
            return profiles
        for spec in specs:
            members: list[tuple[str, Plugin, float | None]] = []
            for ref in spec.refs:
                plugin = self.plugins.get(ref.plugin_ref)
                if plugin is None and ref.plugin_ref in self.sources:
                    raise ConfigError(
                        f"{ref.path}.pluginRef",
                        f"'{ref.plugin_ref}' is a data source, not a filter, scorer or picker; producers and "
                        "data sources run for every request without a profile",
                    )
                if plugin is None:
                    raise ConfigError(
                        f"{ref.path}.pluginRef",
                        f"schedulingProfiles[{spec.name}] references undefined plugin '{ref.plugin_ref}'",
                    )
                members.append((ref.path, plugin, ref.weight))
            profiles[spec.name] = self._profile(spec.name, members, roles)
        return profiles

    def _profile(
        self, name: str, members: list[tuple[str, Plugin, float | None]], roles: PluginRoles
    ) -> SchedulingProfile:
        filters: list[Filter] = []
        scorers: list[WeightedScorer] = []
        picker: Picker | None = None
        for path, plugin, weight in members:
            placed = False
            if plays(plugin, Filter) and plugin in roles.filters:
                filters.append(plugin)
                placed = True
            if plays(plugin, Scorer) and plugin in roles.scorers:
                scorers.append(WeightedScorer(plugin, 1.0 if weight is None else weight))
                placed = True
            if plays(plugin, Picker) and plugin in roles.pickers:
                if picker is not None:
                    raise ConfigError(f"{path}.pluginRef", f"profile '{name}' has a second picker '{plugin.name}'")
                picker = plugin
                placed = True
            if not placed:
                raise ConfigError(
                    f"{path}.pluginRef",
                    f"'{plugin.name}' is a {' and '.join(role_names(plugin)) or 'plugin'}, not a filter, scorer or "
                    "picker; producers and data sources run for every request without a profile",
                )
        if picker is None:
            picker = self._default_picker(roles, name)
        self._check_session_margin(name, scorers)
        return SchedulingProfile(name, picker, filters, scorers)

    def _check_session_margin(self, profile: str, scorers: list[WeightedScorer]) -> None:
        """A session scorer whose weight the profile's other scorers can outvote is a warning."""
        for entry in scorers:
            if isinstance(entry.scorer, SessionAffinityScorer):
                others = sum(w.weight for w in scorers if w is not entry)
                warning = entry.scorer.weight_warning(entry.weight, others)
                if warning is not None:
                    self.warnings.append(f"schedulingProfiles[{profile}]: {warning}")

    def _default_picker(self, roles: PluginRoles, profile: str) -> Picker:
        """llm-d appends the first configured picker, else a max-score-picker, to a profile without one."""
        if roles.pickers:
            self.injected.append(f"picker '{roles.pickers[0].name}' added to profile '{profile}'")
            return roles.pickers[0]
        existing = self.plugins.get("max-score-picker")
        picker = existing if plays(existing, Picker) else self.inject(
            "max-score-picker", "max-score-picker", f"profile '{profile}' has no picker"
        )
        assert plays(picker, Picker)
        return picker

    def profile_handler(self, roles: PluginRoles, profiles: dict[str, SchedulingProfile]) -> ProfileHandler:
        handlers = roles.profile_handlers
        if len(handlers) > 1:
            raise ConfigError(
                self.paths[handlers[1].name],
                f"multiple profile handlers found ('{handlers[0].name}', '{handlers[1].name}'); only one is allowed",
            )
        if not handlers:
            if len(profiles) != 1:
                raise ConfigError("schedulingProfiles", "no profile handler configured")
            handler = self.inject("single-profile-handler", "single-profile-handler", "one profile and no handler")
            assert plays(handler, ProfileHandler)
            return handler
        handler = handlers[0]
        if len(profiles) > 1 and not handler.multi_profile:
            message = (
                "SingleProfileHandler cannot support multiple scheduling profiles"
                if handler.type_name == "single-profile-handler"
                else f"{handler.type_name} runs exactly one scheduling profile; got {len(profiles)} "
                "(prefill/decode disaggregation is not supported)"
            )
            raise ConfigError("schedulingProfiles", message)
        return handler

    # --- parsers, discovery -------------------------------------------------------------------------

    def parsers(self) -> list[RequestParser] | None:
        refs = self.document.parsers
        if refs is None:
            return None
        parsers: list[RequestParser] = []
        for path, ref in refs:
            plugin = self.plugins.get(ref)
            if plugin is None and ref in DEFAULT_PARSERS + ("sglanghttp-parser",):
                plugin = self.inject(ref, ref, "named by requestHandler.parsers")
            if plugin is None:
                raise ConfigError(path, f"parser references undefined plugin '{ref}'")
            if not plays(plugin, RequestParser):
                raise ConfigError(path, f"the plugin '{ref}' is not a parser plugin")
            parsers.append(plugin)
        return parsers

    def cross_replica(self) -> CrossReplicaSyncer | None:
        spec = self.document.data_layer.cross_replica
        if spec is None:
            return None
        plugin = self.plugins.get(spec.plugin_ref)
        if plugin is None:
            raise ConfigError(spec.path, f"the plugin {spec.plugin_ref} is not registered")
        if not plays(plugin, CrossReplicaSyncer):
            raise ConfigError(spec.path, f"'{spec.plugin_ref}' is not a cross-replica syncer (e.g. redis-syncer)")
        plugin.configure(spec.sync_interval_seconds, spec.publish_timeout_seconds)
        return plugin

    def discovery(self) -> Discovery | None:
        spec = self.document.data_layer.discovery
        if spec is None:
            return None
        path, ref = spec
        plugin = self.plugins.get(ref)
        if not plays(plugin, Discovery):
            raise ConfigError(path, f"'{ref}' is not a discovery plugin")
        return plugin

    # --- data layer ---------------------------------------------------------------------------------

    def data_layer(self) -> SourcesPlan:
        return wire_sources(self.document.data_layer.sources, self.plugins, self.sources)

    def implicit_sources(self, layer: SourcesPlan) -> None:
        """After every plugin exists (injected producers included): endpoint extractors no source
        lists get endpoint events through an implicit source; unlisted sources are reported."""
        wired = {id(e) for s in layer.endpoint_sources for e in s.extractors}
        unwired: list[EndpointExtractor] = [e for e in self.roles.endpoint_extractors if id(e) not in wired]
        if unwired:
            name = "(implicit) endpoint-notification-source"
            implicit = SourcePlan(name, _endpoint_notification_source(), Section({}, name, "", []), "(injected)")
            implicit.extractors.extend(unwired)
            layer.add(implicit)
            self.injected.append(
                f"endpoint-notification-source (implicit) → {', '.join(e.name for e in unwired)}: "
                "not listed under dataLayer.sources"
            )
            for extractor in unwired:
                events = extractor.config.kv_events if isinstance(extractor, PrecisePrefixCacheProducer) else None
                if events is not None and events.discover_pods and not events.zmq_endpoint:
                    self.warnings.append(
                        f"{self.paths.get(extractor.name, extractor.name)}: {PRECISE_PRODUCER} '{extractor.name}' "
                        "has discoverPods=true but is not an extractor of an endpoint-notification-source; "
                        "llm-d would receive no KV events (ppc-extproc still subscribes)"
                    )
        for plan in self.sources.values():
            if not layer.listed(plan):
                self.warnings.append(
                    f"{self.paths[plan.name]}: data source '{plan.name}' is not listed under "
                    "dataLayer.sources, so nothing reads from it"
                )

    def build_sources(self, layer: SourcesPlan) -> DataLayer:
        """Build every data source, complete: its extractors and the standing views it declares."""
        view = next((p.load for p in self.roles.producers
                     if isinstance(p, InflightLoadProducer) and p.name == INFLIGHT_LOAD_PRODUCER), None)  # fmt: skip
        data, built = build_sources(layer, self.sources.values(), self.services, view)
        for name, source in built.items():
            self.add(name, source, self.paths[name])
        return data

    def in_document_order(self) -> dict[str, Plugin]:
        """The plugins as the document lists them (sources are built last), injected ones after."""
        listed = [spec.name for spec in self.document.plugins if spec.name in self.plugins]
        ordered = {name: self.plugins[name] for name in listed}
        ordered.update(self.plugins)
        return ordered


def _endpoint_notification_source() -> type[SourceFactory]:
    factory = source_factory("endpoint-notification-source")
    assert factory is not None
    return factory


def load_config_text(text: str, source: str = "<text>", services: Services | None = None) -> LoadedConfig:
    """Load a configuration document. Raises ``ConfigError`` with the field's path."""
    document = parse_document(text, source)
    services = services or Services()
    builder = _Builder(document, services)
    builder.build_plugins()
    roles = builder.roles
    profiles = builder.build_profiles(roles)
    flow_control = resolve_flow_control(builder)  # after the profiles: an injected detector is in none
    handler = builder.profile_handler(roles, profiles)
    parsers = builder.parsers()
    discovery = builder.discovery()
    layer = builder.data_layer()
    resolve_producers(builder, layer, document.data_layer.inject_defaults)
    for plugin in builder.roles.references:  # once every plugin exists, injected producers too
        plugin.resolve_references(builder.plugins)
    builder.implicit_sources(layer)
    data_layer = builder.build_sources(layer)
    roles = builder.roles
    steps = order_producers(roles.producers, builder.paths)
    producer_ids = {id(p) for p in roles.producers}
    streaming = next((p for p in roles.streaming if id(p) in producer_ids), None)
    pipeline = Pipeline(
        producers=steps,
        scheduler=Scheduler(profiles, handler),
        request_arrival=list(roles.request_arrival),
        pre_request=list(roles.pre_request),
        pre_request_async=list(roles.pre_request_async),
        response_complete=list(roles.response_complete),
        response_headers=list(roles.response_headers),
        streaming=streaming,
        parsers=parsers,
        cross_replica=builder.cross_replica(),
    )
    loaded = LoadedConfig(
        source=source, plugins=builder.in_document_order(), roles=roles, pipeline=pipeline, profiles=profiles,
        handler=handler, data_layer=data_layer, discovery=discovery, services=services,
        feature_gates=document.feature_gates, warnings=builder.warnings, injected=builder.injected,
        paths=builder.paths, flow_control=flow_control,
    )
    for warning in loaded.warnings:
        log.warning("config_warning", source=source, message=warning)
    return loaded
