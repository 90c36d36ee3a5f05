"""What the fault suite tried and what went wrong, summed over the session and printed at its end
(``conftest.py``), so that a run states its figures: e.g. ``bad bodies over gRPC: 600, 5xx: 0``."""

from __future__ import annotations

import os
from collections import Counter

from hypothesis import HealthCheck, settings

#: Scale of the generated campaigns; CI runs 1, the figures in BENCHMARKS.md come from larger runs.
SCALE = max(1, int(os.environ.get("PPC_RELIABILITY_SCALE", "1")))

counts: Counter[str] = Counter()


def add(name: str, n: int = 1) -> None:
    counts[name] += n


def campaign(examples: int) -> settings:
    """Hypothesis settings of a campaign: ``examples`` x ``SCALE`` examples, the same ones on every
    run (CI stays reproducible; a larger scale explores further), no deadline, no database."""
    return settings(
        max_examples=examples * SCALE,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.large_base_example,
            HealthCheck.function_scoped_fixture,
        ],
    )
