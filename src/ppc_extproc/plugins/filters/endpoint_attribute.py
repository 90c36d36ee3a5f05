"""``endpoint-attribute-filter``: keep the endpoints whose scalar attribute passes a threshold.

Type        ``endpoint-attribute-filter`` (filter)
Rule        keep an endpoint when ``value <operator> threshold.value``; an endpoint without the
            attribute (never extracted, or stale) is kept with ``onMissing: Pass``, dropped with
            ``Fail``; when nothing is left and ``fallbackOnEmpty`` is true the candidates come back
            unfiltered (false: nothing left ⇒ 429, as any filter that leaves none)
Inputs      the attribute ``<attribute>/<producer>``: a ``customMetrics`` entry of
            ``core-metrics-extractor`` (the default producer) or another extractor's attribute
            (``GPUUtilization`` of ``dcgm-extractor``)
Parameters  (llm-d's names) ``attribute`` (required), ``producer`` [core-metrics-extractor; an
            attribute holding ``/`` needs it set], ``onMissing`` [Pass|Fail, default Pass],
            ``fallbackOnEmpty`` [false], ``algorithm: {type: threshold, threshold: {operator, value}}``
            with operator ``LessThan``, ``LessThanOrEqual``, ``GreaterThan``,
            ``GreaterThanOrEqual``, ``Equal`` or ``NotEqual``

    plugins:
    - type: endpoint-attribute-filter
      name: gpu-utilization-filter
      parameters:
        attribute: GPUUtilization
        producer: dcgm-extractor
        onMissing: Pass
        fallbackOnEmpty: true
        algorithm: {type: threshold, threshold: {operator: LessThanOrEqual, value: 0.90}}

Follows ``llm-d/llm-d-router: pkg/epp/framework/plugins/scheduling/filter/endpointattribute/filter.go``.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence

from ppc_extproc.enginemetrics import (
    CORE_METRICS_EXTRACTOR,
    AttributeStore,
    EngineMetricsReader,
    read_scalar,
    resolve_attribute,
)
from ppc_extproc.errors import ConfigError
from ppc_extproc.framework import ENGINE_METRICS, Consumes, DataConsumer, DataType, Endpoint, Filter, SchedulingContext
from ppc_extproc.framework.params import Section
from ppc_extproc.plugins.registry import Services, register

__all__ = ["OPERATORS", "EndpointAttributeFilter", "attribute_consumes", "attribute_params"]

OPERATORS: dict[str, Callable[[float, float], bool]] = {
    "LessThan": operator.lt,
    "LessThanOrEqual": operator.le,
    "GreaterThan": operator.gt,
    "GreaterThanOrEqual": operator.ge,
    "Equal": operator.eq,
    "NotEqual": operator.ne,
}


def attribute_params(params: Section, attribute_field: str, plugin: str) -> tuple[str, str]:
    """``(attribute, producer)`` of an attribute plugin's parameters (llm-d's key resolution)."""
    attribute = params.string(attribute_field, "")
    if not attribute:
        raise ConfigError(params.child_path(attribute_field), f"{plugin} requires a non-empty {attribute_field}")
    producer = params.string("producer", "") if params.has("producer") else None
    try:
        return resolve_attribute(plugin, attribute, producer)
    except ValueError as exc:
        raise ConfigError(params.child_path(attribute_field), str(exc)) from None


def attribute_consumes(attribute: str, producer: str) -> tuple[Consumes[object], ...]:
    """The attribute, optionally (its producer is chosen in configuration); the core extractor's
    custom metrics come with the engine metrics, so a metrics source is wired for them."""
    need: Consumes[object] = Consumes(DataType(attribute), producer, required=False)
    return (need, Consumes(ENGINE_METRICS)) if producer == CORE_METRICS_EXTRACTOR else (need,)


@register("endpoint-attribute-filter")
class EndpointAttributeFilter(Filter, DataConsumer):
    def __init__(
        self,
        name: str,
        attribute: str,
        producer: str,
        compare: Callable[[float, float], bool],
        threshold: float,
        *,
        pass_on_missing: bool = True,
        fallback_on_empty: bool = False,
        engine_metrics: EngineMetricsReader,
        attributes: AttributeStore,
    ) -> None:
        self.name = name
        self.attribute = attribute
        self.producer = producer
        self.compare = compare
        self.threshold = threshold
        self.pass_on_missing = pass_on_missing
        self.fallback_on_empty = fallback_on_empty
        self.engine_metrics = engine_metrics
        self.attributes = attributes

    @classmethod
    def from_parameters(cls, name: str, params: Section, services: Services) -> EndpointAttributeFilter:
        attribute, producer = attribute_params(params, "attribute", "endpoint attribute filter")
        on_missing = params.string("onMissing", "") or "Pass"
        if on_missing not in ("Pass", "Fail"):
            raise ConfigError(params.child_path("onMissing"), f'must be "Pass" or "Fail", got {on_missing!r}')
        algorithm = params.section("algorithm")
        kind = algorithm.string("type", "")
        if kind != "threshold":
            raise ConfigError(algorithm.child_path("type"), f'must be "threshold", got {kind!r}')
        if not algorithm.has("threshold"):
            raise ConfigError(algorithm.child_path("threshold"), 'required when algorithm.type is "threshold"')
        threshold = algorithm.section("threshold")
        op = threshold.string("operator", "")
        if op not in OPERATORS:
            raise ConfigError(threshold.child_path("operator"), f"must be one of {', '.join(OPERATORS)}; got {op!r}")
        value = threshold.number("value", 0.0)
        threshold.finish()
        algorithm.finish()
        return cls(
            name, attribute, producer, OPERATORS[op], value,
            pass_on_missing=on_missing == "Pass", fallback_on_empty=params.boolean("fallbackOnEmpty", False),
            engine_metrics=services.engine_metrics, attributes=services.attributes,
        )  # fmt: skip

    def consumes(self) -> tuple[Consumes[object], ...]:
        return attribute_consumes(self.attribute, self.producer)

    def filter(self, ctx: SchedulingContext, endpoints: Sequence[Endpoint]) -> list[Endpoint]:
        kept: list[Endpoint] = []
        for endpoint in endpoints:
            value = read_scalar(self.engine_metrics, self.attributes, endpoint.id, self.attribute, self.producer)
            if value is None:
                if self.pass_on_missing:
                    kept.append(endpoint)
            elif self.compare(value, self.threshold):
                kept.append(endpoint)
        if not kept and self.fallback_on_empty:
            return list(endpoints)
        return kept
