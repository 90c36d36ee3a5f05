"""Producers of the data consumers need: default producers, metrics defaults, run order.

llm-d's ``CreateMissingDataProducers`` and producer DAG (``llm-d/llm-d-router:
pkg/epp/datalayer/data_graph.go``), with ppc-extproc's differences:

* ``TokenizedPrompt``: a body that carries token ids is exact tokens already. The estimate
  ``token-producer`` is created only when some consumer accepts estimated ids (approximate and
  burst producers); a precise producer never would use them.
* ``PrefixCacheMatchInfoDataKey/approx-prefix-cache-producer``: created with defaults when a
  scorer reads it (a ``prefix-cache-scorer`` without ``prefixMatchInfoProducerName``), with a
  warning when a precise producer is configured — that silent misconfiguration costs llm-d users
  their precise routing.
* ``MultiModalEncoderCacheMatchInfoKey/mm-embeddings-cache-producer``: created with defaults when
  a scorer reads it and none of that name is configured, as llm-d's default producer.
* ``InFlightLoadDataKey/inflight-load-producer``: created when a consumer reads it (the load
  scorers, the affinity filter, a metrics source's adaptive polling) and none of that name is
  configured, as llm-d's default producers; a consumer naming another producer that does not
  exist is an error at its ``inFlightLoadProducerName``.
* Engine metrics: ``metrics-data-source`` + ``core-metrics-extractor`` are injected (unless
  ``dataLayer.injectDefaults: false``) when a configured plugin requires engine metrics; llm-d
  injects them always, which costs a poll per endpoint every 50 ms that nobody reads.

Data sources are consumers too (``source_consumes``), declared by their type before they are
built: the loader builds them last, with the views they read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from ppc_extproc.config.datalayer import SourcePlan, SourcesPlan
from ppc_extproc.errors import ConfigError
from ppc_extproc.framework import (
    ENGINE_METRICS,
    IN_FLIGHT_LOAD,
    PREFIX_CACHE_MATCH_INFO,
    TOKENIZED_PROMPT,
    AsyncDataProducer,
    Consumes,
    DataConsumer,
    DataKey,
    DataProducer,
    DataType,
    MetricsExtractor,
    Plugin,
    PluginRoles,
    plays,
)
from ppc_extproc.plugins.producers.inflight_load import INFLIGHT_LOAD_PRODUCER
from ppc_extproc.plugins.producers.mm_embeddings_cache import MM_EMBEDDINGS_CACHE_PRODUCER, MM_ENCODER_CACHE_MATCH_INFO
from ppc_extproc.scheduling.router import AsyncProducerStep, ProducerStep

__all__ = ["APPROXIMATE_PRODUCER", "order_producers", "resolve_producers"]

APPROXIMATE_PRODUCER = "approx-prefix-cache-producer"
PRECISE_PRODUCER = "precise-prefix-cache-producer"
TOKEN_PRODUCER = "token-producer"
METRICS_SOURCE = "metrics-data-source"
METRICS_EXTRACTOR = "core-metrics-extractor"

Producer = DataProducer | AsyncDataProducer


class LoaderState(Protocol):
    """What resolving producers reads and extends of a load in progress (``epp._Builder``)."""

    plugins: dict[str, Plugin]
    roles: PluginRoles
    sources: dict[str, SourcePlan]
    paths: dict[str, str]
    warnings: list[str]
    injected: list[str]

    def inject(self, type_name: str, name: str, why: str) -> Plugin: ...

    def inject_source(self, type_name: str, name: str, why: str) -> SourcePlan: ...


@dataclass(slots=True)
class _SourceNeeds:
    """A data source not built yet, as the consumer its type declares."""

    name: str
    type_name: str
    needs: tuple[Consumes[object], ...]

    def consumes(self) -> tuple[Consumes[object], ...]:
        return self.needs


def consumers(builder: LoaderState) -> list[DataConsumer]:
    """Every consumer of the load: the plugins that declare needs and the planned data sources."""
    found: list[DataConsumer] = list(builder.roles.consumers)
    for plan in builder.sources.values():
        found.append(_SourceNeeds(plan.name, plan.type_name, plan.factory.source_consumes))
    return found


def _produced(producers: Sequence[Producer]) -> set[DataKey[object]]:
    keys: set[DataKey[object]] = set()
    for producer in producers:
        keys.update(producer.produces())
    return keys


def _needs(
    consumers: Sequence[DataConsumer], data_type: DataType[object]
) -> list[tuple[DataConsumer, Consumes[object]]]:
    return [(c, need) for c in consumers for need in c.consumes() if need.data_type == data_type]


def resolve_producers(builder: LoaderState, layer: SourcesPlan, inject_defaults: bool) -> None:
    """Create the default producers of required data nobody produces (transitively); raise
    ``ConfigError`` naming the consumer when there is none."""
    configured_approx = any(p.type_name == APPROXIMATE_PRODUCER for p in builder.plugins.values())
    warned: set[str] = set()
    roles = builder.roles
    while True:
        produced = _produced(roles.producers)
        precise = [p.name for p in roles.producers if p.type_name == PRECISE_PRODUCER]
        if _inject_in_flight_load(builder, produced) or _inject_mm_cache(builder, produced):
            continue
        missing: tuple[DataConsumer, Consumes[object]] | None = None
        for consumer, need in _needs(roles.consumers, PREFIX_CACHE_MATCH_INFO):
            if need.producer == APPROXIMATE_PRODUCER and precise and not configured_approx and consumer.name not in warned:
                warned.add(consumer.name)
                builder.warnings.append(
                    f"{builder.paths.get(consumer.name, consumer.name)}: {consumer.type_name} '{consumer.name}' does "
                    f"not set prefixMatchInfoProducerName, so it reads the approximate producer, not the precise "
                    f"producer '{precise[0]}'; set prefixMatchInfoProducerName: {precise[0]} to use KV-event data"
                )
            if need.required and not any(need.satisfied_by(k) for k in produced):
                missing = (consumer, need)
                break
        if missing is not None:
            consumer, need = missing
            if need.producer != APPROXIMATE_PRODUCER:
                producers = ", ".join(p.name for p in roles.producers) or "none"
                raise ConfigError(
                    f"{builder.paths.get(consumer.name, consumer.name)}.parameters.prefixMatchInfoProducerName",
                    f"no producer named '{need.producer}' (producers: {producers}); {need}, consumed by "
                    f"{consumer.name}",
                )
            builder.inject(APPROXIMATE_PRODUCER, APPROXIMATE_PRODUCER, f"{need}, consumed by {consumer.name}")
            continue
        if not any(k.data_type == TOKENIZED_PROMPT for k in produced):
            estimating = [c for c, need in _needs(roles.consumers, TOKENIZED_PROMPT) if need.required and not need.exact_tokens]
            if estimating:
                builder.inject(
                    TOKEN_PRODUCER, TOKEN_PRODUCER,
                    f"TokenizedPrompt (estimate backend), consumed by {', '.join(c.name for c in estimating)}",
                )
                continue
        break
    _check_required(builder)
    _warn_unread(builder)
    _resolve_engine_metrics(builder, layer, inject_defaults)


def _inject_in_flight_load(builder: LoaderState, produced: set[DataKey[object]]) -> bool:
    """Create the default in-flight load producer when a consumer needs it; True when created."""
    for consumer, need in _needs(consumers(builder), IN_FLIGHT_LOAD):
        if not need.required or any(need.satisfied_by(k) for k in produced):
            continue
        if need.producer not in (None, INFLIGHT_LOAD_PRODUCER):
            producers = ", ".join(p.name for p in builder.roles.producers) or "none"
            raise ConfigError(
                f"{builder.paths.get(consumer.name, consumer.name)}.parameters.inFlightLoadProducerName",
                f"no producer named '{need.producer}' (producers: {producers}); {need}, consumed by {consumer.name}",
            )
        builder.inject(INFLIGHT_LOAD_PRODUCER, INFLIGHT_LOAD_PRODUCER, f"{need}, consumed by {consumer.name}")
        return True
    return False


def _inject_mm_cache(builder: LoaderState, produced: set[DataKey[object]]) -> bool:
    """llm-d's default producer of encoder-cache match info, for a scorer reading it; True when created."""
    for consumer, need in _needs(builder.roles.consumers, MM_ENCODER_CACHE_MATCH_INFO):
        if need.required and need.producer == MM_EMBEDDINGS_CACHE_PRODUCER and not any(need.satisfied_by(k) for k in produced):
            builder.inject(MM_EMBEDDINGS_CACHE_PRODUCER, MM_EMBEDDINGS_CACHE_PRODUCER, f"{need}, consumed by {consumer.name}")
            return True
    return False


def _check_required(builder: LoaderState) -> None:
    """Every other required need has a producer (token ids may come in the body, engine metrics
    from the data layer, match info was resolved above)."""
    produced = _produced(builder.roles.producers)
    for consumer in consumers(builder):
        for need in consumer.consumes():
            if need.data_type in (TOKENIZED_PROMPT, ENGINE_METRICS, PREFIX_CACHE_MATCH_INFO) or not need.required:
                continue
            if not any(need.satisfied_by(k) for k in produced):
                raise ConfigError(
                    builder.paths.get(consumer.name, consumer.name),
                    f"no producer of {need}, consumed by {consumer.name}",
                )


def _warn_unread(builder: LoaderState) -> None:
    """A match-info producer no consumer names is wasted work (a common misnaming)."""
    roles = builder.roles
    needs = [need for _, need in _needs(roles.consumers, PREFIX_CACHE_MATCH_INFO)]
    for producer in roles.producers:
        for key in producer.produces():
            if key.data_type == PREFIX_CACHE_MATCH_INFO and not any(n.satisfied_by(key) for n in needs):
                builder.warnings.append(
                    f"{builder.paths.get(producer.name, producer.name)}: {producer.type_name} '{producer.name}' "
                    f"produces {key} but nothing reads it (a scorer names its producer with "
                    "prefixMatchInfoProducerName; unnamed ones read approx-prefix-cache-producer)"
                )


def _resolve_engine_metrics(builder: LoaderState, layer: SourcesPlan, inject_defaults: bool) -> None:
    readers = [c.name for c, need in _needs(builder.roles.consumers, ENGINE_METRICS) if need.required]
    # Only the core extractor writes engine metrics (a dcgm-extractor under its own source does not).
    if not readers or any(e.type_name == METRICS_EXTRACTOR for e in layer.metrics_extractors()):
        return
    if not inject_defaults:
        builder.warnings.append(
            f"{', '.join(readers)} read engine metrics, but no metrics data source is configured and "
            "dataLayer.injectDefaults is false: they score every endpoint 0"
        )
        return
    # A listed metrics source under another name is matched by type (llm-d compares the reference
    # string and would poll every endpoint twice).
    listed = next((s for s in layer.polling_sources if s.type_name == METRICS_SOURCE), None)
    existing_source = builder.sources.get(METRICS_SOURCE)
    source = listed or (existing_source if existing_source is not None and existing_source.polling else None)
    if source is None:
        source = builder.inject_source(METRICS_SOURCE, METRICS_SOURCE, f"engine metrics, read by {', '.join(readers)}")
    existing_extractor = builder.plugins.get(METRICS_EXTRACTOR)
    extractor = existing_extractor if plays(existing_extractor, MetricsExtractor) else None
    if extractor is None:
        made = builder.inject(METRICS_EXTRACTOR, METRICS_EXTRACTOR, f"parses {METRICS_SOURCE}'s polls")
        assert plays(made, MetricsExtractor)
        extractor = made
    source.add(extractor)
    layer.add(source)
    builder.injected.append(f"dataLayer.sources += {{{source.name} → [{extractor.name}]}}")
    # The source reads the in-flight load (adaptive polling): its producer may be new too.
    _inject_in_flight_load(builder, _produced(builder.roles.producers))


def order_producers(
    producers: Sequence[Producer], paths: Mapping[str, str]
) -> list[ProducerStep | AsyncProducerStep]:
    """Producers in dependency order (a consumer after the producers of its data), ties in
    configuration order. Raises ``ConfigError`` on a cycle."""
    keys = {p.name: p.produces() for p in producers}
    deps: dict[str, set[str]] = {}
    requires: dict[str, set[DataKey[object]]] = {}
    for producer in producers:
        deps[producer.name] = set()
        requires[producer.name] = set()
        for need in producer.consumes():
            for other in producers:
                if other is producer:
                    continue
                matched = [k for k in keys[other.name] if need.satisfied_by(k)]
                if matched:
                    deps[producer.name].add(other.name)
                    if need.required:
                        requires[producer.name].update(matched)
    ordered: list[Producer] = []
    done: set[str] = set()
    pending = list(producers)
    while pending:
        ready = next((p for p in pending if deps[p.name] <= done), None)
        if ready is None:
            cycle = " → ".join(p.name for p in pending)
            raise ConfigError(paths.get(pending[0].name, "plugins"), f"producer dependency cycle among: {cycle}")
        ordered.append(ready)
        done.add(ready.name)
        pending.remove(ready)
    steps: list[ProducerStep | AsyncProducerStep] = []
    for producer in ordered:
        needed = frozenset(requires[producer.name])
        if plays(producer, AsyncDataProducer):
            steps.append(AsyncProducerStep(producer, needed))
        elif plays(producer, DataProducer):
            steps.append(ProducerStep(producer, needed))
    return steps
