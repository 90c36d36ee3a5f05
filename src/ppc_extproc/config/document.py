"""An ``EndpointPickerConfig`` document, decoded: top-level sections, deprecated aliases, feature
gates, plugin specs and profile specs — before any plugin is built.

Follows ``llm-d/llm-d-router: apix/config/v1alpha1/endpointpickerconfig_types.go`` and
``pkg/epp/config/loader/configloader.go``: strict keys, ``name`` defaulting to ``type``, the
deprecated top-level ``parser`` and ``saturationDetector``, the deprecated apiVersion.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import yaml

from ppc_extproc.errors import ConfigError
from ppc_extproc.flowcontrol.config import FlowControlSpec, parse_flow_control
from ppc_extproc.framework.params import Section
from ppc_extproc.plugins.producers.token_producer_config import pool_config_to_params

__all__ = [
    "API_VERSIONS",
    "FEATURE_GATES",
    "ConfigDocument",
    "DataLayerSpec",
    "PluginSpec",
    "ProfileRef",
    "ProfileSpec",
    "SourceSpec",
    "parse_document",
]

API_VERSION = "llm-d.ai/v1alpha1"
DEPRECATED_API_VERSION = "inference.networking.x-k8s.io/v1alpha1"
API_VERSIONS = (API_VERSION, DEPRECATED_API_VERSION)
#: llm-d's registered gates and their defaults (``cmd/epp/runner/runner.go``).
FEATURE_GATES = {"flowControl": False, "haPopulateNonLeaderDatastore": True}
#: Deprecated plugin types accepted under their replacement's name.
TYPE_ALIASES = {"tokenizer": "token-producer"}


@dataclass(frozen=True, slots=True)
class PluginSpec:
    name: str
    type_name: str
    params: Section
    #: ``plugins[i]``
    path: str
    #: The type as written, when it was a deprecated alias.
    alias_of: str | None = None


@dataclass(frozen=True, slots=True)
class ProfileRef:
    path: str
    plugin_ref: str
    #: None: not given (scorers default to 1.0).
    weight: float | None


@dataclass(frozen=True, slots=True)
class ProfileSpec:
    name: str
    path: str
    refs: tuple[ProfileRef, ...]


@dataclass(frozen=True, slots=True)
class SourceSpec:
    path: str
    plugin_ref: str
    #: (path, pluginRef) of each extractor.
    extractors: tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class DataLayerSpec:
    inject_defaults: bool = True
    sources: tuple[SourceSpec, ...] = ()
    #: (path, pluginRef) of ``dataLayer.discovery``.
    discovery: tuple[str, str] | None = None


@dataclass
class ConfigDocument:
    api_version: str
    feature_gates: dict[str, bool]
    plugins: list[PluginSpec]
    profiles: list[ProfileSpec]
    data_layer: DataLayerSpec
    #: ``requestHandler.parsers`` as (path, pluginRef); None: not set (llm-d's default list).
    parsers: list[tuple[str, str]] | None
    #: Shared with every section: deprecated, ignored or replaced inputs.
    warnings: list[str] = field(default_factory=list)
    #: (path, pluginRef) of the saturation detector (``flowControl.saturationDetector``), if set.
    saturation_detector: tuple[str, str] | None = None
    #: The decoded ``flowControl`` section, if present (honoured with the ``flowControl`` gate).
    flow_control: FlowControlSpec | None = None


def _feature_gates(root: Section) -> dict[str, bool]:
    gates = dict(FEATURE_GATES)
    for path, item in root.items("featureGates"):
        if not isinstance(item, str):
            raise ConfigError(path, "expected a feature gate name, name=true or name=false")
        name, sep, value = item.partition("=")

        if name not in FEATURE_GATES:
            raise ConfigError(path, f"feature gate '{name}' is unknown or unregistered")
        if sep:
            text = value.strip().lower()
            if text not in ("1", "t", "true", "0", "f", "false"):
                raise ConfigError(path, f"{value.strip()} is not a valid value for the feature gate {name}")
            gates[name] = text in ("1", "t", "true")
        else:
            gates[name] = True
    return gates


def _plugin_specs(root: Section) -> list[PluginSpec]:
    items = list(root.items("plugins"))
    if not items:
        raise ConfigError("plugins", "at least one plugin is required")
    specs: list[PluginSpec] = []
    names: set[str] = set()
    for path, item in items:
        spec = root.sub(item, path)
        written = spec.string("type", "")
        if not written:
            name = spec.string("name", "")
            raise ConfigError(f"{path}.type", f"plugin '{name or path}' is missing a type")
        type_name = TYPE_ALIASES.get(written, written)
        name = spec.string("name", "") or written
        # llm-d's pitfall: a token producer not named 'token-producer' publishes under its own name,
        # so llm-d also creates an estimate 'token-producer' (ppc-extproc uses this one for all).
        renamed = (
            f"token-producer named '{name}': llm-d would also create an estimate 'token-producer'; "
            "ppc-extproc uses this one for every consumer"
        ) if type_name == "token-producer" and name != type_name else None  # fmt: skip
        if type_name != written:
            deprecation = f"DEPRECATION: plugin type '{written}' is deprecated; use '{type_name}' instead"
            spec.warn("type", f"{deprecation} ({renamed})" if renamed else deprecation)
        elif renamed:
            spec.warn("name", renamed)
        if name in names:
            raise ConfigError(f"{path}.name", f"duplicate plugin name '{name}'")
        names.add(name)
        params = root.sub(spec.raw("parameters", {}), f"{path}.parameters", owner=type_name, fold_case=True)
        spec.finish()
        specs.append(PluginSpec(name, type_name, params, path, written if type_name != written else None))
    return [*specs, *_legacy_token_producer(root, specs, names)]


def _legacy_token_producer(root: Section, specs: list[PluginSpec], names: set[str]) -> list[PluginSpec]:
    """A ``token-producer`` for the deprecated scorer's ``indexerConfig.tokenizersPoolConfig``
    (llm-d tokenized inside that scorer), unless a token producer is configured."""
    if any(s.type_name == "token-producer" for s in specs) or "token-producer" in names:
        return []
    for spec in specs:
        indexer = spec.params.data.get("indexerConfig") if spec.type_name == "precise-prefix-cache-scorer" else None
        if isinstance(indexer, dict) and "tokenizersPoolConfig" in indexer:
            where = f"{spec.params.path}.indexerConfig.tokenizersPoolConfig"
            params = pool_config_to_params(indexer["tokenizersPoolConfig"], where)
            root.warnings.append(
                f"{where}: DEPRECATION: tokenizersPoolConfig is deprecated in llm-d; loaded as a token-producer "
                f"with parameters {params} (configure a token-producer instead)"
            )
            return [PluginSpec("token-producer", "token-producer", root.sub(params, where, owner="token-producer"), where)]
    return []


def _profile_specs(root: Section) -> list[ProfileSpec]:
    profiles: list[ProfileSpec] = []
    seen: set[str] = set()
    for path, item in root.items("schedulingProfiles"):
        spec = root.sub(item, path)
        name = spec.string("name", "")
        if not name:
            raise ConfigError(f"{path}.name", "a scheduling profile needs a name")
        if name in seen:
            raise ConfigError(f"{path}.name", f"duplicate scheduling profile name '{name}'")
        seen.add(name)
        refs = []
        for ref_path, ref in spec.items("plugins"):
            ref_spec = root.sub(ref, ref_path)
            plugin_ref = ref_spec.string("pluginRef", "")
            if not plugin_ref:
                raise ConfigError(f"{ref_path}.pluginRef", "missing")
            weight = ref_spec.number("weight", 1.0, minimum=0.0) if ref_spec.has("weight") else None
            ref_spec.finish()
            refs.append(ProfileRef(ref_path, plugin_ref, weight))
        spec.finish()
        profiles.append(ProfileSpec(name, path, tuple(refs)))
    return profiles


def _refs(section: Section, key: str) -> list[tuple[str, str]]:
    refs = []
    for path, item in section.items(key):
        ref = section.sub(item, path)
        plugin_ref = ref.string("pluginRef", "")
        if not plugin_ref:
            raise ConfigError(f"{path}.pluginRef", "missing")
        ref.finish()
        refs.append((path, plugin_ref))
    return refs


def _data_layer(root: Section) -> DataLayerSpec:
    section = root.section("dataLayer")
    inject = section.boolean("injectDefaults", True)
    sources = []
    for path, item in section.items("sources"):
        source = section.sub(item, path)
        ref = source.string("pluginRef", "")
        if not ref:
            raise ConfigError(f"{path}.pluginRef", "missing")
        extractors = tuple(_refs(source, "extractors"))
        source.finish()
        sources.append(SourceSpec(path, ref, extractors))
    discovery = None
    if section.has("discovery"):
        spec = section.section("discovery")
        discovery = (spec.child_path("pluginRef"), spec.string("pluginRef", ""))
        spec.finish()
    for ignored in ("peerDiscovery", "crossReplicaSyncerPluginRef", "crossReplicaSyncInterval"):
        if section.has(ignored):
            section.raw(ignored)
            section.warn(ignored, "multi-replica state sync is not implemented; every replica reads every "
                                  "engine's KV events instead (accepted and ignored)")  # fmt: skip
    section.finish()
    return DataLayerSpec(inject, tuple(sources), discovery)


def _request_handler(root: Section) -> list[tuple[str, str]] | None:
    parsers: list[tuple[str, str]] | None = None
    if root.has("requestHandler"):
        handler = root.section("requestHandler")
        if handler.has("parsers"):
            parsers = _refs(handler, "parsers")
        handler.finish()
    if root.has("parser"):
        legacy = root.section("parser")
        ref = legacy.string("pluginRef", "")
        legacy.finish()
        root.warn("parser", "DEPRECATION: top-level parser is deprecated, use requestHandler.parsers instead. "
                            "If both are set, the new field is used.")  # fmt: skip
        if not parsers and ref:
            parsers = [("parser.pluginRef", ref)]
    return parsers or None


def _detector_ref(section: Section, key: str) -> tuple[str, str] | None:
    spec = section.raw(key)
    if not isinstance(spec, dict) or not isinstance(spec.get("pluginRef"), str):
        return None
    return f"{section.child_path(key)}.pluginRef", spec["pluginRef"]


def _flow_control(root: Section, gates: dict[str, bool]) -> tuple[tuple[str, str] | None, FlowControlSpec | None]:
    """The saturation detector's (path, pluginRef), if any, and the decoded section; warns as
    llm-d does about a section the gate leaves off."""
    legacy = None
    if root.has("saturationDetector"):
        legacy = _detector_ref(root, "saturationDetector")
        root.warn("saturationDetector", "DEPRECATION: top-level saturationDetector is deprecated, use "
                                        "flowControl.saturationDetector instead. If both are set, the new field is "
                                        "used.")  # fmt: skip
    current = None
    spec = None
    if root.has("flowControl"):
        section = root.section("flowControl")
        current = _detector_ref(section, "saturationDetector")
        if set(section.data) - {"saturationDetector"} and not gates["flowControl"]:
            root.warn("flowControl", "WARNING: the flowControl config section is set but the flowControl feature "
                                     "gate is disabled; its settings (other than saturationDetector) are ignored")  # fmt: skip
        spec = parse_flow_control(section)
    return current or legacy, spec  # llm-d: the new field wins

def parse_document(text: str, source: str = "<text>") -> ConfigDocument:
    """Decode a document. Raises ``ConfigError`` with the field's path."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError("", f"{source} is not valid YAML: {exc}") from None
    root = Section(data, "", owner="EndpointPickerConfig")
    api_version = root.string("apiVersion", API_VERSION)
    if api_version not in API_VERSIONS:
        raise ConfigError("apiVersion", f"must be one of {', '.join(API_VERSIONS)}; got {api_version!r}")
    if api_version == DEPRECATED_API_VERSION:
        root.warn("apiVersion", f"DEPRECATION: apiVersion {api_version}/EndpointPickerConfig is deprecated; "
                                f"use {API_VERSION}")  # fmt: skip
    root.string("kind", "EndpointPickerConfig", choices=("EndpointPickerConfig",))
    gates = _feature_gates(root)
    plugins = _plugin_specs(root)
    profiles = _profile_specs(root)
    data_layer = _data_layer(root)
    parsers = _request_handler(root)
    detector, flow_control = _flow_control(root, gates)
    root.finish()
    return ConfigDocument(api_version, gates, plugins, profiles, data_layer, parsers, root.warnings, detector,
                          flow_control)  # fmt: skip
