"""``core-metrics-extractor``: engine load from a polled ``/metrics`` body, per endpoint.

Type        ``core-metrics-extractor`` (metrics extractor; list it under a ``metrics-data-source``)
Behaviour   the endpoint's engine is its label ``engineLabelKey`` (falling back to
            ``inference.networking.k8s.io/engine-type``), else ``defaultEngine``; that engine's
            specs pick the families read (only those are parsed). Queued and running requests, KV
            usage, cache block size and count, LoRA adapters and custom metrics are stored as the
            endpoint's ``EngineMetrics`` (what the load scorers read). A spec'd family the body
            lacks is an extract error; the other fields still update. A body with none of the load
            families its engine config names is refused (wrong port, not an engine).
Parameters  ``engineLabelKey`` ["llm-d.ai/engine-type"], ``defaultEngine`` ["vllm"],
            ``engineConfigs`` [built-ins: vllm, sglang, trtllm-serve, triton-tensorrt-llm, triton]:
            ``{name, queuedRequestsSpec, runningRequestsSpec, kvUsageSpec, loraSpec, cacheInfoSpec,
            cacheBlockSizeLabelName, cacheNumBlocksLabelName, cacheBlockSizeSpec, cacheNumBlocksSpec,
            customMetrics: [{attributeKey, metricSpec}]}``; an entry replaces the built-in of its name
            whole (a spec it leaves out is not read); a name may appear once.
            Spec syntax: ``name`` or ``name{label=value,…}``.

    plugins:
    - type: core-metrics-extractor
      parameters:
        engineConfigs:
        - name: my-engine
          queuedRequestsSpec: my_queue{kind=waiting}
          runningRequestsSpec: my_running
          kvUsageSpec: my_kv_usage

Follows llm-d-router ``pkg/epp/framework/plugins/datalayer/extractor/metrics/factories.go``; one
divergence: several series of one family (several engines behind one endpoint) are summed for
queued/running and the fullest KV cache is taken, where llm-d reads only the newest series.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ppc_extproc.enginemetrics import (
    BUILTIN_ENGINES,
    EngineMapping,
    EngineMetricsStore,
    MetricSpec,
    parse_engine_metrics,
)
from ppc_extproc.errors import ConfigError
from ppc_extproc.framework import (
    Endpoint,
    MetricsExtractor,
    PluginState,
    StateReporter,
)
from ppc_extproc.framework.params import Section, decode, param
from ppc_extproc.plugins.registry import Services, register

__all__ = ["CoreMetricsExtractor"]

DEFAULT_ENGINE_LABEL_KEY = "llm-d.ai/engine-type"
LEGACY_ENGINE_LABEL_KEY = "inference.networking.k8s.io/engine-type"


def _spec(section: Section, key: str, default: MetricSpec | None) -> MetricSpec | None:
    if not section.has(key):
        return default
    try:
        return MetricSpec.parse(section.string(key, ""))
    except ValueError as exc:
        raise ConfigError(section.child_path(key), str(exc)) from None


def _engine(section: Section) -> EngineMapping:
    name = section.string("name", "")
    if not name:
        raise ConfigError(section.child_path("name"), "engine config name cannot be empty")
    if name == "default":
        raise ConfigError(section.child_path("name"), 'engine config name cannot be "default" (reserved)')
    base = EngineMapping(name)  # replaces a built-in of the same name whole, as llm-d does
    custom = []
    for path, item in section.items("customMetrics"):
        metric = section.sub(item, path)
        key = metric.string("attributeKey", "")
        if not key:
            raise ConfigError(f"{path}.attributeKey", "must not be empty")
        spec = _spec(metric, "metricSpec", None)
        if spec is None:
            raise ConfigError(f"{path}.metricSpec", "must not be empty")
        metric.finish()
        custom.append((key, spec))
    mapping = EngineMapping(
        name,
        queued=_spec(section, "queuedRequestsSpec", base.queued),
        running=_spec(section, "runningRequestsSpec", base.running),
        kv_usage=_spec(section, "kvUsageSpec", base.kv_usage),
        lora=_spec(section, "loraSpec", base.lora),
        cache_info=_spec(section, "cacheInfoSpec", base.cache_info),
        cache_block_size_label=section.string("cacheBlockSizeLabelName", "") or base.cache_block_size_label,
        cache_num_blocks_label=section.string("cacheNumBlocksLabelName", "") or base.cache_num_blocks_label,
        cache_block_size=_spec(section, "cacheBlockSizeSpec", base.cache_block_size),
        cache_num_blocks=_spec(section, "cacheNumBlocksSpec", base.cache_num_blocks),
        custom=tuple(custom),
    )
    section.finish()
    return mapping


@dataclass(frozen=True, slots=True)
class CoreMetricsConfig:
    """The extractor's scalar parameters; each ``engineConfigs`` entry is decoded into an
    ``EngineMapping`` (metric specs are parsed, not plain values)."""

    default_engine: str = param("defaultEngine", "vllm")
    engine_label_key: str = param("engineLabelKey", DEFAULT_ENGINE_LABEL_KEY)


@register("core-metrics-extractor")
class CoreMetricsExtractor(MetricsExtractor, StateReporter):
    """Writes each endpoint's ``EngineMetrics`` into the shared store."""

    def __init__(
        self,
        name: str,
        store: EngineMetricsStore,
        engines: Mapping[str, EngineMapping] | None = None,
        *,
        default_engine: str = "vllm",
        engine_label_key: str = DEFAULT_ENGINE_LABEL_KEY,
    ) -> None:
        self.name = name
        self.store = store
        self.engines = dict(engines or BUILTIN_ENGINES)
        if default_engine not in self.engines:
            raise ValueError(f"defaultEngine {default_engine!r} not found in engineConfigs")
        self.default_engine = default_engine
        self.engine_label_key = engine_label_key
        self.extract_errors = 0
        self.missing_families: dict[str, int] = {}

    @classmethod
    def from_parameters(cls, name: str, params: Section, services: Services) -> CoreMetricsExtractor:
        engines = dict(BUILTIN_ENGINES)
        configured: set[str] = set()
        for path, item in params.items("engineConfigs"):
            mapping = _engine(params.sub(item, path))
            if mapping.name in configured:
                raise ConfigError(f"{path}.name", f"engine config {mapping.name!r} already exists")
            configured.add(mapping.name)
            engines[mapping.name] = mapping
        config = decode(params, CoreMetricsConfig)
        default = config.default_engine or "vllm"
        if default not in engines:
            raise ConfigError(params.child_path("defaultEngine"), f"defaultEngine {default!r} not found in engineConfigs")
        label_key = config.engine_label_key or DEFAULT_ENGINE_LABEL_KEY
        return cls(name, services.engine_metrics, engines, default_engine=default, engine_label_key=label_key)

    def mapping_for(self, endpoint: Endpoint) -> EngineMapping:
        engine = endpoint.label(self.engine_label_key) or endpoint.label(LEGACY_ENGINE_LABEL_KEY)
        return self.engines.get(engine or "", self.engines[self.default_engine])

    def extract_metrics(self, endpoint: Endpoint, payload: bytes, now: float) -> None:
        mapping = self.mapping_for(endpoint)
        parsed = parse_engine_metrics(payload, mapping, now)
        metrics = parsed.metrics
        for family in parsed.missing:
            self.missing_families[family] = self.missing_families.get(family, 0) + 1
        reads_load = any(s is not None for s in (mapping.queued, mapping.running, mapping.kv_usage))
        if reads_load and metrics.waiting is None and metrics.running is None and metrics.kv_usage is None:
            self.extract_errors += 1
            raise ValueError(f"no {mapping.name} load metrics in the response")
        if parsed.missing:
            self.extract_errors += 1
        self.store.set(endpoint.id, metrics)

    def forget_endpoint(self, endpoint_id: str) -> None:
        self.store.forget(endpoint_id)

    def state(self, *, detailed: bool = False) -> PluginState:
        return PluginState(
            self.name, self.type_name,
            details={
                "defaultEngine": self.default_engine,
                "engines": sorted(self.engines),
                "extractErrors": self.extract_errors,
                "missingFamilies": dict(self.missing_families),
                "endpoints": len(self.store),
            },
        )
