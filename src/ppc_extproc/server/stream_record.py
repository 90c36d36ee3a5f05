"""What one routed request records: the decision (latency by stage, llm-d's scheduling series,
the match ratio, the admin API's recent decisions) and, when its response ends, usage and
llm-d's request families (``llm-d/llm-d-router: pkg/epp/metrics/metrics.go``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ppc_extproc.matchinfo import PrefixCacheMatchInfo
from ppc_extproc.observability.llmd_metrics import PARSE_KEY, RequestSeries
from ppc_extproc.observability.metrics import Metrics
from ppc_extproc.scheduling.router import Decision
from ppc_extproc.server.stream_protocol import MAX_REQUEST_ID_CHARS
from ppc_extproc.server.usage import Usage

__all__ = ["record_completion", "record_decision"]


def record_decision(
    metrics: Metrics,
    recorder: Callable[[dict[str, Any]], None] | None,
    request_id: str,
    decision: Decision,
    series: RequestSeries | None,
    body_bytes: int,
    started: float,
    parse_done: float,
    decided: float,
) -> None:
    """A decision for a body whose assembly started at ``started``, parsed at ``parse_done`` and
    decided at ``decided`` (``perf_counter`` times; the record is written after the reply)."""
    elapsed = decided - started
    timings = decision.timings
    stages = {
        "parse": parse_done - started,
        **decision.ctx.timings,
        "score": timings["filter"] + timings["score"] + timings["pick"],
        "pre_request": timings["pre_request"],
    }
    metrics.observe_decision(elapsed, stages)
    if series is not None:
        primary = decision.primary
        ctx = decision.ctx
        ctx.plugin_timings.append((PARSE_KEY, stages["parse"]))
        metrics.llmd.scheduled(series, body_bytes, ctx.request.model, primary.name.rpartition("/")[2] or primary.id,
                               primary.port, stages["score"], ctx.plugin_timings)
    info = decision.ctx.match_info(decision.primary.id)
    if info is not None and info.total_blocks:
        metrics.match_ratio.observe(info.match_blocks / info.total_blocks)
    if recorder is not None:
        recorder({
            "requestId": request_id,
            "destination": decision.destination,
            "model": decision.ctx.request.model[:MAX_REQUEST_ID_CHARS],
            "promptTokens": decision.ctx.request.prompt_tokens,
            "tokenizeOutcome": decision.ctx.request.tokenize_outcome,
            "matchBlocks": info.match_blocks if info else None,
            "totalBlocks": info.total_blocks if info else None,
            "cachedTokensPredicted": info.cached_tokens if info else None,
            "totals": {ep: round(v, 6) for ep, v in decision.result.primary.totals.items()},
            "decisionMs": round(elapsed * 1e3, 3),
        })


def record_completion(
    metrics: Metrics,
    series: RequestSeries | None,
    status: int,
    usage: Usage | None,
    predicted: PrefixCacheMatchInfo | None,
    elapsed: float,
    response_bytes: int,
) -> None:
    """A routed request's response ended with ``status`` after ``elapsed`` seconds; ``predicted``
    is the serving endpoint's match info."""
    if series is not None:
        if status != 200:
            metrics.llmd.failed(series, "ModelServerError", running=False)
        metrics.llmd.completed(
            series, elapsed, response_bytes,
            usage.prompt_tokens if usage else None, usage.completion_tokens if usage else None,
            usage.cached_tokens if usage else None,
        )
    if usage is not None:
        for kind, value in (("prompt", usage.prompt_tokens), ("completion", usage.completion_tokens),
                            ("cached", usage.cached_tokens)):
            if value:
                metrics.usage_tokens.labels(kind).inc(value)
        if usage.cached_tokens is not None and status == 200 and predicted is not None:
            # vLLM reports only the last prompt's cached tokens for a batch: compare like with like
            metrics.observe_cached_tokens(predicted.reported_cached_tokens, usage.cached_tokens)
