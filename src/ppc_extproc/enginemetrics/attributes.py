"""Scalar endpoint attributes keyed like llm-d's data keys (``"<attribute>/<producer>"``).

llm-d's extractors put ``ScalarMetricValue`` attributes on the endpoint (``GPUUtilization`` from
``dcgm-extractor``, a ``customMetrics`` entry from ``core-metrics-extractor``) and the generic
``endpoint-attribute-filter``/``-scorer`` read one by key
(``llm-d/llm-d-router: pkg/epp/framework/plugins/datalayer/attribute/metrics/data_types.go``).
``AttributeStore`` holds the ones polled outside the engine metrics; ``read_scalar`` finds a key
in either place. A value older than the staleness window reads as missing, as engine metrics do.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from ppc_extproc.enginemetrics.types import DEFAULT_STALE_AFTER_SECONDS, EngineMetricsReader

__all__ = ["CORE_METRICS_EXTRACTOR", "AttributeStore", "attribute_key", "read_scalar", "resolve_attribute"]

#: The producer of custom metrics (and llm-d's default ``producer`` of the attribute plugins).
CORE_METRICS_EXTRACTOR = "core-metrics-extractor"


def attribute_key(attribute: str, producer: str) -> str:
    """llm-d's data key text: ``"<attribute>/<producer>"`` (no producer: the attribute alone)."""
    return f"{attribute}/{producer}" if producer else attribute


class AttributeStore:
    """Latest value per endpoint and attribute key; bounded by the endpoints polled (an endpoint's
    values are dropped with ``forget``) times the keys extractors write."""

    def __init__(
        self, *, clock: Callable[[], float] = time.monotonic, stale_after_seconds: float = DEFAULT_STALE_AFTER_SECONDS
    ) -> None:
        self.clock = clock
        self.stale_after_seconds = stale_after_seconds
        self._values: dict[str, dict[str, tuple[float, float]]] = {}
        self._lock = threading.Lock()

    def expect_updates_every(self, interval_seconds: float, polls: int = 20) -> None:
        """A poller writes every ``interval_seconds``: values go stale after ``polls`` missed polls."""
        self.stale_after_seconds = max(self.stale_after_seconds, interval_seconds * polls)

    def put(self, endpoint_id: str, key: str, value: float, now: float | None = None) -> None:
        stamp = self.clock() if now is None else now
        with self._lock:
            self._values.setdefault(endpoint_id, {})[key] = (value, stamp)

    def get(self, endpoint_id: str, key: str) -> float | None:
        """The value, or None when never written or stale."""
        entry = self._values.get(endpoint_id, {}).get(key)
        if entry is None or self.clock() - entry[1] > self.stale_after_seconds:
            return None
        return entry[0]

    def forget(self, endpoint_id: str, key: str | None = None) -> None:
        """Drop one key of an endpoint, or (``key`` None) all of them."""
        with self._lock:
            if key is None:
                self._values.pop(endpoint_id, None)
            elif (values := self._values.get(endpoint_id)) is not None:
                values.pop(key, None)
                if not values:
                    del self._values[endpoint_id]

    def __len__(self) -> int:
        return len(self._values)


def read_scalar(
    engine_metrics: EngineMetricsReader, attributes: AttributeStore, endpoint_id: str, attribute: str, producer: str
) -> float | None:
    """An endpoint's scalar attribute: a custom metric of the core extractor (from the engine
    metrics, when fresh) or what another extractor wrote; None when missing or stale."""
    if producer == CORE_METRICS_EXTRACTOR:
        metrics = engine_metrics.snapshot(endpoint_id)
        if metrics is not None and not metrics.stale and attribute in metrics.custom:
            return metrics.custom[attribute]
    return attributes.get(endpoint_id, attribute_key(attribute, producer))


def resolve_attribute(plugin: str, attribute: str, producer: str | None) -> tuple[str, str]:
    """``(attribute, producer)`` as llm-d's ``ResolveConfiguredKey`` reads them: no producer ⇒ the
    core extractor; an attribute holding ``/`` without a producer is refused (the old combined
    ``Attribute/Producer`` spelling, which would silently match nothing). Raises ValueError."""
    if producer is not None:
        return attribute, producer
    if "/" in attribute:
        head, _, tail = attribute.rpartition("/")
        raise ValueError(
            f"{plugin}: attribute {attribute!r} contains '/' but no producer is set. The attribute and its "
            f"producer are separate parameters; if this is the combined \"Attribute/Producer\" spelling, split "
            f"it into attribute: {head!r} and producer: {tail!r}. If the attribute name itself contains '/', "
            "set producer explicitly"
        )
    return attribute, CORE_METRICS_EXTRACTOR
