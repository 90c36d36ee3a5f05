"""Per-request records and what a policy's run adds up to.

hit rate        Σ cached_tokens / Σ prompt_tokens over completed requests (``usage``)
TTFT            first token chunk − request sent; p50 / p90 (linear interpolation)
throughput      completed output tokens (and requests) / the run's window, where the window
                runs from the first scheduled arrival to the last completion (at least to the
                end of the schedule): a policy that falls behind needs a longer window
imbalance       requests per engine over *all* engines: max / mean, and the coefficient of
                variation (population stdev / mean)
errors          requests that failed (HTTP status, transport error, error in the stream)
unfinished      requests still open, or never sent, at the run's deadline
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["UNFINISHED", "RequestRecord", "Summary", "percentile", "summarize"]

#: ``RequestRecord.error`` values of requests cut off by the run's deadline.
UNFINISHED = frozenset({"deadline", "not_sent"})


@dataclass(slots=True)
class RequestRecord:
    """What happened to one scheduled request (times in seconds from the run's start)."""

    index: int
    user: int
    tenant: int
    stage: int
    turn: int
    scheduled_s: float
    prompt_tokens: int = 0
    sent_s: float | None = None
    first_token_s: float | None = None
    done_s: float | None = None
    cached_tokens: int | None = None
    output_tokens: int = 0
    endpoint: str | None = None
    status: int | None = None
    error: str | None = None
    #: How late the generator sent it, beyond the user's own previous turn (event-loop lag).
    send_lag_s: float | None = None
    #: Sent straight to an engine, bypassing the router (outside traffic).
    direct: bool = False
    #: The P/D leg the serving engine saw (``x-mock-vllm-kv-transfer``: ``decode`` = disaggregated),
    #: None for a request prefilled where it was decoded.
    kv_transfer: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.status == 200 and self.done_s is not None

    @property
    def ttft_s(self) -> float | None:
        if self.first_token_s is None or self.sent_s is None:
            return None
        return self.first_token_s - self.sent_s

    @property
    def latency_s(self) -> float | None:
        if self.done_s is None or self.sent_s is None:
            return None
        return self.done_s - self.sent_s


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0–100) with linear interpolation (NumPy's default); NaN if empty."""
    if not 0 <= q <= 100:
        raise ValueError("q must be in [0, 100]")
    if not values:
        return math.nan
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@dataclass(frozen=True, slots=True)
class Summary:
    """One policy (or one stage of it) in numbers."""

    policy: str
    scheduled: int
    completed: int
    errors: int
    unfinished: int
    prompt_tokens: int
    cached_tokens: int
    hit_rate: float
    ttft_p50_s: float
    ttft_p90_s: float
    latency_p50_s: float
    latency_p90_s: float
    window_s: float
    output_tokens_per_s: float
    requests_per_s: float
    imbalance_max_mean: float
    imbalance_cv: float
    requests_per_endpoint: dict[str, int] = field(default_factory=dict)
    #: Label of the subset (e.g. ``"8.0 req/s"`` for one stage), empty for the whole run.
    label: str = ""
    #: Completed requests that were disaggregated (their decode engine received the prompt's KV).
    disaggregated: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _imbalance(counts: Sequence[int]) -> tuple[float, float]:
    if not counts or sum(counts) == 0:
        return math.nan, math.nan
    mean = statistics.fmean(counts)
    return max(counts) / mean, statistics.pstdev(counts) / mean


def summarize(
    policy: str,
    records: Iterable[RequestRecord],
    *,
    endpoints: Sequence[str] = (),
    start_s: float = 0.0,
    end_s: float | None = None,
    label: str = "",
) -> Summary:
    """Sum up ``records``; ``endpoints`` lists every engine (so idle ones count in imbalance);
    the throughput window is ``[start_s, max(end_s, last completion)]``."""
    recs = list(records)
    done = [r for r in recs if r.ok]
    prompt = sum(r.prompt_tokens for r in done)
    cached = sum(r.cached_tokens or 0 for r in done)
    ttfts = [t for r in done if (t := r.ttft_s) is not None]
    lats = [t for r in done if (t := r.latency_s) is not None]
    per_endpoint = {e: 0 for e in endpoints}
    for r in done:
        if r.endpoint is not None:
            per_endpoint[r.endpoint] = per_endpoint.get(r.endpoint, 0) + 1
    last = max((r.done_s for r in done if r.done_s is not None), default=start_s)
    end = max(last, end_s if end_s is not None else start_s)
    window = end - start_s
    out_tokens = sum(r.output_tokens for r in done)
    unfinished = sum(1 for r in recs if not r.ok and (r.error is None or r.error in UNFINISHED))
    max_mean, cv = _imbalance(list(per_endpoint.values()))
    return Summary(
        policy=policy,
        scheduled=len(recs),
        completed=len(done),
        errors=len(recs) - len(done) - unfinished,
        unfinished=unfinished,
        prompt_tokens=prompt,
        cached_tokens=cached,
        hit_rate=cached / prompt if prompt else math.nan,
        ttft_p50_s=percentile(ttfts, 50),
        ttft_p90_s=percentile(ttfts, 90),
        latency_p50_s=percentile(lats, 50),
        latency_p90_s=percentile(lats, 90),
        window_s=window,
        output_tokens_per_s=out_tokens / window if window > 0 else math.nan,
        requests_per_s=len(done) / window if window > 0 else math.nan,
        imbalance_max_mean=max_mean,
        imbalance_cv=cv,
        disaggregated=sum(1 for r in done if r.kv_transfer == "decode"),
        requests_per_endpoint=per_endpoint,
        label=label,
    )
