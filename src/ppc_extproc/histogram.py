"""A histogram's bucket counts kept by hand, for the custom Prometheus collectors that export
many label sets cheaply (one ``bisect`` and two additions per observation, no locks or label
lookups as ``prometheus_client.Histogram`` pays)."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

__all__ = ["BucketCounts"]


class BucketCounts:
    """Per-bucket counts (the last is +Inf) and the sum of what was observed."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value

    def buckets(self) -> list[tuple[str, float]]:
        """Cumulative ``(le, count)`` pairs as ``HistogramMetricFamily.add_metric`` takes them."""
        out: list[tuple[str, float]] = []
        running = 0
        for bound, n in zip(self.bounds, self.counts):
            running += n
            out.append((repr(float(bound)), running))
        out.append(("+Inf", running + self.counts[-1]))
        return out
