"""``endpoint-attribute-scorer``: score endpoints linearly by a scalar attribute.

Type        ``endpoint-attribute-scorer`` (scorer)
Formula     ``(v − min) / (max − min)``, inverted for ``linear_lower_is_better``;
            ``adaptiveRange`` (default): min and max over the candidates that have the attribute,
            all equal ⇒ 1.0 for each; ``fixedRange {min, max}``: values clamped to the range
Missing     an endpoint without the attribute (never extracted, or stale) scores 0 and takes no
            part in the adaptive range, as in llm-d
Inputs      the attribute ``<attributeKey>/<producer>`` (see ``endpoint-attribute-filter``)
Parameters  (llm-d's names) ``attributeKey`` (required), ``producer`` [core-metrics-extractor],
            ``algorithm.type`` ``linear_lower_is_better`` | ``linear_higher_is_better`` (required),
            ``algorithm.normalization``: at most one of ``adaptiveRange: {}`` and
            ``fixedRange: {min, max}`` (min < max)

    plugins:
    - type: endpoint-attribute-scorer
      name: gpu-utilization-scorer
      parameters:
        attributeKey: GPUUtilization
        producer: dcgm-extractor
        algorithm: {type: linear_lower_is_better, normalization: {fixedRange: {min: 0.0, max: 1.0}}}

Follows ``llm-d/llm-d-router: pkg/epp/framework/plugins/scheduling/scorer/endpointattribute/endpointattribute.go``.
"""

from __future__ import annotations

from collections.abc import Sequence

from ppc_extproc.enginemetrics import AttributeStore, EngineMetricsReader, read_scalar
from ppc_extproc.errors import ConfigError
from ppc_extproc.framework import Consumes, DataConsumer, Endpoint, SchedulingContext, Scorer
from ppc_extproc.framework.params import Section
from ppc_extproc.ids import EndpointId
from ppc_extproc.plugins.filters.endpoint_attribute import attribute_consumes, attribute_params
from ppc_extproc.plugins.registry import Services, register

__all__ = ["EndpointAttributeScorer"]

_TYPES = ("linear_lower_is_better", "linear_higher_is_better")


@register("endpoint-attribute-scorer")
class EndpointAttributeScorer(Scorer, DataConsumer):
    def __init__(
        self,
        name: str,
        attribute: str,
        producer: str,
        *,
        lower_is_better: bool,
        fixed_range: tuple[float, float] | None,
        engine_metrics: EngineMetricsReader,
        attributes: AttributeStore,
    ) -> None:
        self.name = name
        self.attribute = attribute
        self.producer = producer
        self.lower_is_better = lower_is_better
        self.fixed_range = fixed_range
        self.engine_metrics = engine_metrics
        self.attributes = attributes

    @classmethod
    def from_parameters(cls, name: str, params: Section, services: Services) -> EndpointAttributeScorer:
        attribute, producer = attribute_params(params, "attributeKey", "endpoint attribute scorer")
        algorithm = params.section("algorithm")
        kind = algorithm.string("type", "")
        if kind not in _TYPES:
            raise ConfigError(algorithm.child_path("type"), f'must be "{_TYPES[0]}" or "{_TYPES[1]}", got {kind!r}')
        normalization = algorithm.section("normalization")
        if normalization.has("fixedRange") and normalization.has("adaptiveRange"):
            raise ConfigError(normalization.path, "at most one normalization strategy, got both fixedRange and adaptiveRange")
        fixed: tuple[float, float] | None = None
        if normalization.has("fixedRange"):
            bounds = normalization.section("fixedRange")
            low, high = bounds.number("min", 0.0), bounds.number("max", 0.0)
            if low >= high:
                raise ConfigError(bounds.path, f"requires min < max, got min {low:g}, max {high:g}")
            bounds.finish()
            fixed = (low, high)
        if normalization.has("adaptiveRange"):
            normalization.section("adaptiveRange").finish()
        normalization.finish()
        algorithm.finish()
        return cls(
            name, attribute, producer, lower_is_better=kind == _TYPES[0], fixed_range=fixed,
            engine_metrics=services.engine_metrics, attributes=services.attributes,
        )  # fmt: skip

    def consumes(self) -> tuple[Consumes[object], ...]:
        return attribute_consumes(self.attribute, self.producer)

    def score(self, ctx: SchedulingContext, endpoints: Sequence[Endpoint]) -> dict[EndpointId, float]:
        values: dict[EndpointId, float] = {}
        for endpoint in endpoints:
            value = read_scalar(self.engine_metrics, self.attributes, endpoint.id, self.attribute, self.producer)
            if value is not None:
                values[endpoint.id] = value
        scores = dict.fromkeys((e.id for e in endpoints), 0.0)
        if not values:
            return scores
        if self.fixed_range is not None:
            low, high = self.fixed_range
        else:
            low, high = min(values.values()), max(values.values())
            if low == high:
                return {**scores, **dict.fromkeys(values, 1.0)}
        for endpoint_id, value in values.items():
            normalized = min(1.0, max(0.0, (value - low) / (high - low)))
            scores[endpoint_id] = 1.0 - normalized if self.lower_is_better else normalized
        return scores
