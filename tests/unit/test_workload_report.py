"""The report math: hit rate, percentiles, throughput window, imbalance; tables; progress line."""

from __future__ import annotations

import io
import math

import pytest

from ppc_extproc_lab.workload.oracle import OracleTarget
from ppc_extproc_lab.workload.progress import ProgressLine
from ppc_extproc_lab.workload.report import RequestRecord, percentile, summarize
from ppc_extproc_lab.workload.runner import Progress
from ppc_extproc_lab.workload.table import format_table


def rec(
    index: int,
    *,
    endpoint: str = "a",
    prompt: int = 100,
    cached: int = 0,
    sent: float = 0.0,
    ttft: float = 0.1,
    latency: float = 1.0,
    out: int = 10,
    error: str | None = None,
    status: int = 200,
) -> RequestRecord:
    r = RequestRecord(index, user=0, tenant=0, stage=0, turn=0, scheduled_s=sent, prompt_tokens=prompt)
    r.sent_s, r.status, r.error, r.endpoint = sent, status, error, endpoint
    if error is None:
        r.first_token_s, r.done_s = sent + ttft, sent + latency
        r.cached_tokens, r.output_tokens = cached, out
    return r


def test_percentile_linear_interpolation() -> None:
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([10], 90) == 10
    assert percentile([0, 10], 90) == 9
    assert percentile([5, 1, 3], 0) == 1 and percentile([5, 1, 3], 100) == 5
    assert math.isnan(percentile([], 50))
    with pytest.raises(ValueError):
        percentile([1], 101)


def test_hit_rate_is_token_weighted_over_completed_requests() -> None:
    records = [
        rec(0, prompt=100, cached=100),
        rec(1, prompt=300, cached=0),
        rec(2, prompt=1000, error="http 500: boom", status=500),  # not counted
    ]
    s = summarize("p", records, endpoints=["a", "b"])
    assert s.hit_rate == pytest.approx(100 / 400)
    assert (s.prompt_tokens, s.cached_tokens) == (400, 100)
    assert (s.scheduled, s.completed, s.errors, s.unfinished) == (3, 2, 1, 0)


def test_ttft_latency_and_throughput_window() -> None:
    records = [rec(i, sent=float(i), ttft=0.1 * (i + 1), latency=2.0, out=20) for i in range(10)]
    s = summarize("p", records, endpoints=["a"], start_s=0.0, end_s=5.0)
    assert s.ttft_p50_s == pytest.approx(0.55)
    assert s.ttft_p90_s == pytest.approx(0.91)
    assert s.latency_p50_s == pytest.approx(2.0)
    # Last completion at 9 + 2 = 11 s, after the schedule's end: the window stretches to it.
    assert s.window_s == pytest.approx(11.0)
    assert s.output_tokens_per_s == pytest.approx(200 / 11)
    assert s.requests_per_s == pytest.approx(10 / 11)
    # A schedule that ends later than the last completion sets the window instead.
    assert summarize("p", records, end_s=20.0).window_s == pytest.approx(20.0)


def test_imbalance_counts_idle_endpoints() -> None:
    records = [
        rec(0, endpoint="a"),
        rec(1, endpoint="a"),
        rec(2, endpoint="a"),
        rec(3, endpoint="b"),
    ]
    s = summarize("p", records, endpoints=["a", "b", "c", "d"])
    assert s.requests_per_endpoint == {"a": 3, "b": 1, "c": 0, "d": 0}
    assert s.imbalance_max_mean == pytest.approx(3.0)  # mean 1
    assert s.imbalance_cv == pytest.approx(math.sqrt((4 + 0 + 1 + 1) / 4))
    even = summarize("p", [rec(i, endpoint=e) for i, e in enumerate("abab")], endpoints=["a", "b"])
    assert (even.imbalance_max_mean, even.imbalance_cv) == (1.0, 0.0)


def test_unfinished_versus_errors() -> None:
    never = RequestRecord(5, 0, 0, 0, 0, 1.0, error="not_sent")
    cut = RequestRecord(6, 0, 0, 0, 0, 1.0, sent_s=1.0, error="deadline")
    s = summarize("p", [rec(0), never, cut, rec(1, error="ClientError: x", status=0)])
    assert (s.completed, s.errors, s.unfinished) == (1, 1, 2)


def test_empty_summary_is_nan_not_an_error() -> None:
    s = summarize("p", [], endpoints=["a"])
    assert s.completed == 0 and math.isnan(s.hit_rate) and math.isnan(s.ttft_p90_s)
    assert math.isnan(s.imbalance_max_mean)


def test_text_and_markdown_tables() -> None:
    rows = [
        summarize("precise", [rec(0, cached=90), rec(1, cached=90)], endpoints=["a"]),
        summarize("round-robin", [rec(0, cached=0)], endpoints=["a"]),
    ]
    text = format_table(rows).splitlines()
    assert text[0].split()[:3] == ["policy", "hit", "rate"]
    assert text[2].startswith("precise ") and "90.0%" in text[2]
    assert "0.0%" in text[3]
    md = format_table(rows, ("policy", "hit_rate", "ttft_p90"), markdown=True).splitlines()
    assert md[0] == "| policy      | hit rate | TTFT p90 ms |"
    assert md[1].startswith("|---") and md[1].endswith(":|")
    assert md[2] == "| precise     |    90.0% |         100 |"


def test_oracle_prefers_cache_then_load() -> None:
    o = OracleTarget(["http://e0", "http://e1", "http://e2"], seed=1)
    assert o.choose([0, 128, 64]) == "http://e1"
    o.in_flight.update({"http://e0": 2, "http://e1": 0, "http://e2": 1})
    assert o.choose([64, 64, 64]) == "http://e1"
    assert o.choose([64, 0, 64]) == "http://e2"
    # A failed match (-1) never wins over an engine that answered.
    assert o.choose([-1, 0, -1]) == "http://e1"
    with pytest.raises(ValueError):
        OracleTarget([])


def test_progress_line_plain_and_tty() -> None:
    p = Progress(
        elapsed_s=5.0,
        schedule_s=10.0,
        scheduled=100,
        sent=50,
        completed=40,
        errors=2,
        prompt_tokens=1000,
        cached_tokens=250,
    )
    assert p.in_flight == 8
    out = io.StringIO()
    line = ProgressLine("precise", out, plain_interval_s=3600)
    line(p)
    line(p)  # throttled
    line.close()  # prints the last snapshot once more, since it was throttled
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    assert "sent 50/100" in lines[0] and "hit 25.0%" in lines[0] and "#" * 12 in lines[0]
