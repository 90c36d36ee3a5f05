"""What flow control costs a request when the pool is not saturated (the fast path).

In process, no sockets: the ext_proc stream state machine driven as Envoy drives it (BUFFERED:
headers, then the JSON body) through the default configuration's pipeline, 16 (``--endpoints``) endpoints whose
engine metrics are fresh and idle (refreshed between requests, as a scraper would), a warm index.
Two services built from the same configuration text, one with ``featureGates: [flowControl]``
(every default policy: utilization detector, in-flight credit, global-strict, FCFS, static
limit), rounds alternating between them; each request is timed from its first message to the
stream's close (admission, routing, the response end that releases it), requests alternating
between the two (the order swapped every round). Also the admission call
alone (admit → routed → finished).

    python benchmarks/bench_flow_control.py [--requests 2000] [--rounds 5] [--tokens 1024] [--endpoints 16]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time
from pathlib import Path

import orjson
from envoy.service.ext_proc.v3.external_processor_pb2 import HttpHeaders, ProcessingRequest
from prometheus_client import CollectorRegistry

sys.path.insert(0, str(Path(__file__).parent))
from _common import header, percentile
from bench_decision import default_config, request_messages

from ppc_extproc.config.epp import load_config_text
from ppc_extproc.enginemetrics import EngineMetrics
from ppc_extproc.framework import Endpoint
from ppc_extproc.index import PodEntry
from ppc_extproc.observability.metrics import Metrics
from ppc_extproc.scheduling.pool import EndpointPool
from ppc_extproc.scheduling.router import Router
from ppc_extproc.server.flow import build_admission
from ppc_extproc.server.stream import BodyMode, ExtProcStream, StreamOptions
from ppc_extproc.tokens import TokenizedPrompt
from ppc_extproc.tokens.le32 import tokens_to_le32

ENDPOINTS: list[Endpoint] = []


def warm(producer: object, prompts: list[list[int]]) -> None:
    """Every endpoint holds a different share of each prompt's prefix; a few hold all of it."""
    n = len(ENDPOINTS)
    for tokens in prompts:
        keys = producer.block_keys(TokenizedPrompt("m", (tokens_to_le32(tokens),)))[0]  # type: ignore[attr-defined]
        for i, endpoint in enumerate(ENDPOINTS):
            held = len(keys) if i < 3 else len(keys) * i // n
            if held:
                producer.index.add(None, keys[:held], [PodEntry(endpoint.id, "gpu")])  # type: ignore[attr-defined]


def build(text: str) -> tuple[Router, StreamOptions, object, object]:
    loaded = load_config_text(text)
    pool = EndpointPool()
    pool.replace(ENDPOINTS)
    router = Router(pool, loaded.pipeline, inflight=loaded.services.inflight)
    admission, controller = build_admission(loaded, pool, CollectorRegistry(), "pool")
    options = StreamOptions(default_body_mode=BodyMode.BUFFERED, admission=admission)
    producer = next(p for p in loaded.roles.producers if p.type_name == "precise-prefix-cache-producer")
    return router, options, loaded, (producer, admission, controller)


def refresh(loaded: object) -> None:
    store = loaded.services.engine_metrics  # type: ignore[attr-defined]
    now = time.monotonic()
    for endpoint in ENDPOINTS:
        store.set(endpoint.id, EngineMetrics(0, 2, 0.1, 16, 4096, updated_at=now))


async def run(services: list[tuple[Router, StreamOptions, object]], messages: list[list[ProcessingRequest]],
              requests: int) -> list[list[float]]:
    """Requests alternate between the services (one after the other, same prompt), so both see
    the same machine load."""
    metrics = [Metrics(CollectorRegistry()) for _ in services]
    response = ProcessingRequest(response_headers=HttpHeaders(end_of_stream=True))
    samples: list[list[float]] = [[] for _ in services]
    for i in range(requests):
        msgs = messages[i % len(messages)]
        for k, (router, options, loaded) in enumerate(services):
            refresh(loaded)
            start = time.perf_counter()
            stream = ExtProcStream(router, options, metrics[k])
            for message in msgs:
                await stream.handle(message)
            await stream.handle(response)
            stream.close()
            samples[k].append(time.perf_counter() - start)
    return samples


async def admission_only(admission: object, loaded: object, requests: int) -> list[float]:
    headers = {"x-llm-d-inference-fairness-id": "tenant"}
    samples = []
    for i in range(requests):
        refresh(loaded)
        start = time.perf_counter()
        ticket = await admission.admit(f"r{i}", headers, 0, 4000, "m", "m")  # type: ignore[attr-defined]
        ticket.routed(ENDPOINTS[i % len(ENDPOINTS)].id, 1000)
        ticket.finished(1024, 8)
        samples.append(time.perf_counter() - start)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--endpoints", type=int, default=16)
    args = parser.parse_args()
    ENDPOINTS.extend(Endpoint(f"10.0.{i // 250}.{i % 250 + 1}", 8000) for i in range(args.endpoints))
    base = default_config(16)
    gated = base + "featureGates: [flowControl]\n"
    rng = random.Random(7)
    prompts = [[rng.randrange(1, 150_000) for _ in range(args.tokens)] for _ in range(32)]
    bodies = [orjson.dumps({"model": "m", "prompt": p, "max_tokens": 8}) for p in prompts]
    messages = [request_messages(b, "/v1/completions", BodyMode.BUFFERED) for b in bodies]
    off, on = build(base), build(gated)
    for _router, _options, loaded, (producer, _, _) in (off, on):
        warm(producer, prompts)
        refresh(loaded)
    header(f"flow control, not saturated: {args.tokens}-token prompts, {args.endpoints} endpoints, "
           f"{args.requests} requests × {args.rounds} rounds")  # fmt: skip
    off_samples: list[float] = []
    on_samples: list[float] = []
    for r in range(args.rounds):
        pair = [on[:3], off[:3]] if r % 2 else [off[:3], on[:3]]
        first, second = asyncio.run(run(pair, messages, args.requests))
        off_samples += second if r % 2 else first
        on_samples += first if r % 2 else second
    only = asyncio.run(admission_only(on[3][1], on[2], args.requests * args.rounds))
    controller = on[3][2]
    assert controller is not None and controller.queued == 0 and controller.unplaced == 0

    def row(name: str, samples: list[float]) -> str:
        return (f"| {name} | {percentile(samples, 50) * 1e3:.3f} | {percentile(samples, 99) * 1e3:.3f} | "
                f"{statistics.fmean(samples) * 1e3:.3f} |")  # fmt: skip

    print("| per request | p50 ms | p99 ms | mean ms |")
    print("|---|---:|---:|---:|")
    print(row("flow control off", off_samples))
    print(row("flow control on (fast path)", on_samples))
    print(row("admission alone (admit → routed → finished)", only))
    delta = percentile(on_samples, 50) - percentile(off_samples, 50)
    print(f"p50 difference: {delta * 1e3:+.3f} ms; ratio on/off {percentile(on_samples, 50) / percentile(off_samples, 50):.3f}")


if __name__ == "__main__":
    main()
