"""Load an ``EndpointPickerConfig`` (llm-d's YAML shape) into plugins and a scheduling profile.

    apiVersion: llm-d.ai/v1alpha1
    kind: EndpointPickerConfig
    plugins: [{type, name?, parameters?}]
    schedulingProfiles: [{name, plugins: [{pluginRef, weight?}]}]
    dataLayer: {sources: [{pluginRef, extractors: [{pluginRef}]}], discovery: {pluginRef}}

A configuration written for llm-d's precise-prefix routing loads unchanged for the plugin types
ppc-extproc supports; an unsupported type is an error listing the supported ones. Every error names
the field's path. Spec: ``block_keys_and_index.md`` §7.3.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import structlog
import yaml

from ppc_extproc.config.strict import Section
from ppc_extproc.errors import ConfigError
from ppc_extproc.matchinfo import match_info_key
from ppc_extproc.plugins.registry import Services, create_plugin, registered_types
from ppc_extproc.scheduling.inflight import InflightTracker
from ppc_extproc.scheduling.profile import SchedulingProfile, WeightedScorer

__all__ = ["LoadedConfig", "default_config_text", "load_config", "load_config_text"]

log = structlog.get_logger(__name__)

API_VERSIONS = ("llm-d.ai/v1alpha1", "inference.networking.x-k8s.io/v1alpha1")
#: Top-level sections accepted for compatibility but not used by ppc-extproc.
_IGNORED_SECTIONS = ("featureGates", "flowControl", "requestHandler", "saturationDetector")
APPROXIMATE_PRODUCER_TYPE = "approx-prefix-cache-producer"


@dataclass
class LoadedConfig:
    """Plugins built from a configuration, wired by role."""

    source: str
    plugins: dict[str, Any]
    producers: list[Any]
    profile: SchedulingProfile
    #: The discovery plugin (``dataLayer.discovery``), if any.
    discovery: Any | None
    services: Services
    warnings: list[str] = field(default_factory=list)

    def plugins_with(self, method: str) -> list[Any]:
        return [p for p in self.plugins.values() if callable(getattr(p, method, None))]


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


def _role(plugin: Any) -> str:
    for method, role in (("pick", "picker"), ("filter", "filter"), ("score", "scorer"), ("produce", "producer")):
        if callable(getattr(plugin, method, None)):
            return role
    return "other"


def load_config_text(text: str, source: str = "<text>", services: Services | None = None) -> LoadedConfig:
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError("", f"{source} is not valid YAML: {exc}") from None
    root = Section(document, "", owner="EndpointPickerConfig")
    api_version = root.string("apiVersion", "llm-d.ai/v1alpha1")
    if api_version not in API_VERSIONS:
        raise ConfigError("apiVersion", f"must be one of {', '.join(API_VERSIONS)}; got {api_version!r}")
    root.string("kind", "EndpointPickerConfig", choices=("EndpointPickerConfig",))
    warnings: list[str] = []
    for name in _IGNORED_SECTIONS:
        if root.has(name):
            warnings.append(f"{name} is accepted for llm-d compatibility and ignored by ppc-extproc")
    services = services or Services()
    if services.inflight is None:
        services.inflight = InflightTracker(clock=services.clock)

    plugins = _build_plugins(root, services)
    producers = [p for p in plugins.values() if _role(p) == "producer"]
    profile = _build_profile(root, plugins)
    discovery = _data_layer(root.section("dataLayer"), plugins)
    root.finish()
    loaded = LoadedConfig(source, plugins, producers, profile, discovery, services, warnings)
    _bind_match_info_consumers(loaded)
    for warning in loaded.warnings:
        log.warning("config_warning", source=source, message=warning)
    return loaded


def _build_plugins(root: Section, services: Services) -> dict[str, Any]:
    plugins: dict[str, Any] = {}
    items = list(root.items("plugins"))
    if not items:
        raise ConfigError("plugins", "at least one plugin is required")
    for path, item in items:
        spec = Section(item, path)
        type_name = spec.string("type", "")
        if not type_name:
            raise ConfigError(f"{path}.type", f"missing; supported types: {', '.join(registered_types())}")
        name = spec.string("name", "") or type_name
        if name in plugins:
            raise ConfigError(f"{path}.name", f"duplicate plugin name {name!r}")
        params = Section(spec.raw("parameters", {}), f"{path}.parameters", owner=type_name)
        spec.finish()
        plugin = create_plugin(type_name, name, params, services)
        plugins[name] = plugin
        services.plugins[name] = plugin
    return plugins


def _build_profile(root: Section, plugins: dict[str, Any]) -> SchedulingProfile:
    profiles = list(root.items("schedulingProfiles"))
    if len(profiles) > 1:
        raise ConfigError(
            "schedulingProfiles",
            f"ppc-extproc runs one scheduling profile; got {len(profiles)} "
            "(prefill/decode disaggregation is not supported)",
        )
    if not profiles:  # llm-d: plugins but no profiles ⇒ everything goes into profile "default"
        refs: list[tuple[str, str, float | None]] = [(f"plugins[{i}]", n, None) for i, n in enumerate(plugins)]
        name = "default"
        refs = [r for r in refs if _role(plugins[r[1]]) in ("scorer", "filter", "picker")]
    else:
        path, item = profiles[0]
        spec = Section(item, path)
        name = spec.string("name", "default")
        refs = []
        for ref_path, ref in spec.items("plugins"):
            ref_spec = Section(ref, ref_path)
            plugin_ref = ref_spec.string("pluginRef", "")
            weight = ref_spec.number("weight", 1.0, minimum=0.0) if ref_spec.has("weight") else None
            ref_spec.finish()
            refs.append((ref_path, plugin_ref, weight))
        spec.finish()
    profile = SchedulingProfile(name)
    for ref_path, plugin_ref, weight in refs:
        plugin = plugins.get(plugin_ref)
        if plugin is None:
            raise ConfigError(f"{ref_path}.pluginRef", f"no plugin named {plugin_ref!r} (plugins: {', '.join(plugins)})")
        role = _role(plugin)
        if role == "scorer":
            profile.scorers.append(WeightedScorer(plugin, 1.0 if weight is None else weight))
        elif role == "filter":
            profile.filters.append(plugin)
        elif role == "picker":
            if profile.picker is not None:
                raise ConfigError(f"{ref_path}.pluginRef", f"profile {name!r} has a second picker {plugin_ref!r}")
            profile.picker = plugin
        else:
            raise ConfigError(
                f"{ref_path}.pluginRef",
                f"{plugin_ref!r} is a {role}, not a filter, scorer or picker; producers run for every request",
            )
    if profile.picker is None:
        profile.picker = create_plugin("max-score-picker", "max-score-picker", Section({}, "max-score-picker"), Services())
    return profile


def _data_layer(section: Section, plugins: dict[str, Any]) -> Any | None:
    for path, item in section.items("sources"):
        source = Section(item, path)
        ref = source.string("pluginRef", "")
        if ref not in plugins:
            raise ConfigError(f"{path}.pluginRef", f"no plugin named {ref!r}")
        for extractor_path, extractor in source.items("extractors"):
            ext = Section(extractor, extractor_path)
            ext_ref = ext.string("pluginRef", "")
            if ext_ref not in plugins:
                raise ConfigError(f"{extractor_path}.pluginRef", f"no plugin named {ext_ref!r}")
            if not callable(getattr(plugins[ext_ref], "extract", None)):
                raise ConfigError(f"{extractor_path}.pluginRef", f"{ext_ref!r} does not consume endpoint events")
            ext.finish()
        source.finish()
    discovery = None
    if section.has("discovery"):
        spec = section.section("discovery")
        ref = spec.string("pluginRef", "")
        discovery = plugins.get(ref)
        if discovery is None or not callable(getattr(discovery, "run", None)):
            raise ConfigError(f"{spec.path}.pluginRef", f"{ref!r} is not a discovery plugin")
        spec.finish()
    for optional in ("metricsSources", "collectors"):
        section.raw(optional)
    section.finish()
    return discovery


def _bind_match_info_consumers(loaded: LoadedConfig) -> None:
    """Scorers reading match info must find their producer; an unnamed one reads the approximate
    producer (llm-d's fallback), which is created when missing — with a warning if a precise
    producer is configured, since that silent misconfiguration costs llm-d users days."""
    producers = {getattr(p, "name", ""): p for p in loaded.producers}
    precise = [p.name for p in loaded.producers if getattr(p, "type_name", "") == "precise-prefix-cache-producer"]
    for name, plugin in list(loaded.plugins.items()):
        if not hasattr(plugin, "producer_name"):
            continue
        wanted = plugin.producer_name
        if wanted:
            if wanted not in producers:
                raise ConfigError(
                    f"plugins[{list(loaded.plugins).index(name)}].parameters.prefixMatchInfoProducerName",
                    f"no producer named {wanted!r} (producers: {', '.join(producers) or 'none'})",
                )
            continue
        if precise:
            loaded.warnings.append(
                f"{plugin.type_name} {name!r} does not set prefixMatchInfoProducerName, so it reads the "
                f"approximate producer, not the precise producer {precise[0]!r}; set "
                f"prefixMatchInfoProducerName: {precise[0]} to use KV-event data"
            )
        approx = next(
            (p for p in loaded.producers if getattr(p, "type_name", "") == APPROXIMATE_PRODUCER_TYPE), None
        )
        if approx is None:
            if APPROXIMATE_PRODUCER_TYPE not in registered_types():
                raise ConfigError(
                    f"plugins[{list(loaded.plugins).index(name)}].parameters.prefixMatchInfoProducerName",
                    "must name a producer (the approximate producer is not available)",
                )
            approx = create_plugin(
                APPROXIMATE_PRODUCER_TYPE, APPROXIMATE_PRODUCER_TYPE,
                Section({}, APPROXIMATE_PRODUCER_TYPE), loaded.services,
            )
            loaded.plugins[APPROXIMATE_PRODUCER_TYPE] = approx
            loaded.producers.append(approx)
            producers[APPROXIMATE_PRODUCER_TYPE] = approx
        plugin.attribute_key = match_info_key(approx.name)
