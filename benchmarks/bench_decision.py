"""Decision latency: body end of stream → routing reply.

``--part grpc`` (what users pay): ``ppc-extproc serve`` with the default configuration (block size
16) and 16 live mock engines (``LocalCluster`` without Envoy) in their own processes, driven over a real gRPC channel as the shipped ``envoy.yaml``
sends requests (BUFFERED: headers, then the whole body in one message), next to a trivial grpc.aio
ext_proc that only moves the same request (``_grpc_extproc.py``) and, with grpclib installed (the
``bench`` extra), the same on pure-Python HTTP/2 (``_grpclib_extproc.py``): token-id prompts of
1K–200K tokens. "ours − trivial" is against the grpc.aio one. ``--prompts repeated`` (the default) sends 4 prompts in turn, each again within the
speculative TTL so the index holds its prefix (the lookup walks every block); ``new-tail`` one long
prefix with a new 1,024-token tail every request (an agentic session's next turns); ``fresh`` a new
prompt every request. Each process's page faults per request are printed. ``--baseline-src DIR`` adds a row for another checkout's ``src`` (the
code before a change), served the same way. ``--load-rate 3`` measures each size again under
agentic load (``AgenticLoad``: 3 fresh 100K-token prompts a second to the engines, whose KV events
the service ingests, and to the ext_proc as routing requests, while the timed requests run); after
each load phase it waits until the service's admitted blocks stop rising, so the next idle phase
has no KV events left to ingest.

``--part inproc`` drives the ext_proc stream state machine the way Envoy does (headers, then the JSON body in 16 KiB
chunks) and times the last call, 16 endpoints:

* token-id prompts of 1K/8K/32K/100K tokens, a warm index — idle, and while another thread applies
  KV events at 50k blocks/s (the GIL is shared);
* chat requests of 8K/32K/100K/200K tokens through the ``token-producer``: ``local`` (the tiny
  tokenizer built at run time, in process) and ``vllm`` (the render endpoint of a ``mock-vllm
  --tokenizer`` subprocess). *cold*: a conversation never seen (nothing in the segment cache, no
  endpoint caches it); *warm*: the same system prompt and history with a new user turn, the shared
  prefix cached by some endpoints and its text pieces in the segment cache.

    python benchmarks/bench_decision.py --part grpc [--requests 200] [--baseline-src /tmp/base/src] [--load-rate 3]
                                        [--prompts repeated|new-tail|fresh]
    python benchmarks/bench_decision.py --part inproc [--block-size 64] [--requests 200] [--skip-tokens] [--skip-chat]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import orjson
from envoy.config.core.v3.base_pb2 import HeaderMap, HeaderValue
from envoy.service.ext_proc.v3.external_processor_pb2 import HttpBody, HttpHeaders, ProcessingRequest

sys.path.insert(0, str(Path(__file__).parent))
from _common import grpclib_extproc, header, percentile

from ppc_extproc.config.epp import load_config_text
from ppc_extproc.events.decode import decode_batch
from ppc_extproc.framework import Endpoint
from ppc_extproc.index import PodEntry
from ppc_extproc.observability.logging import configure_logging
from ppc_extproc.observability.metrics import Metrics
from ppc_extproc.scheduling.pool import EndpointPool
from ppc_extproc.scheduling.router import Router
from ppc_extproc.server.stream import BodyMode, ExtProcStream, StreamOptions
from ppc_extproc.tokens import TokenizedPrompt
from ppc_extproc.tokens.le32 import tokens_to_le32

CONFIG = """
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: precise-prefix-cache-producer
  parameters:
    tokenProcessorConfig: {{blockSizeTokens: {block_size}}}
    speculativeIndexing: true
    kvEventsConfig: {{discoverPods: false}}
- type: prefix-cache-scorer
  parameters: {{prefixMatchInfoProducerName: precise-prefix-cache-producer}}
- type: active-request-scorer
schedulingProfiles:
- name: default
  plugins: [{{pluginRef: prefix-cache-scorer, weight: 3}}, {{pluginRef: active-request-scorer, weight: 2}}]
"""
ENDPOINTS = [Endpoint(f"10.0.0.{i + 1}", 8000) for i in range(16)]
CHUNK = 16 * 1024


def default_config(block_size: int) -> str:
    """The embedded default configuration (``config/default.yaml``) with ``block_size``."""
    import yaml

    from ppc_extproc_lab.localcluster.service_config import default_service_config

    return yaml.safe_dump(default_service_config(block_size=block_size), sort_keys=False)


def build_router(block_size: int, config: str = "bench") -> tuple[Router, object]:
    text = default_config(block_size) if config == "default" else CONFIG.format(block_size=block_size)
    loaded = load_config_text(text)
    pool = EndpointPool()
    pool.replace(ENDPOINTS)
    producer = next(p for p in loaded.roles.producers if p.type_name == "precise-prefix-cache-producer")
    return Router(pool, loaded.pipeline, inflight=loaded.services.inflight), producer


def warm(producer, prompts: list[list[int]]) -> None:
    """Every endpoint holds a different share of each prompt's prefix; a few hold all of it."""
    for tokens in prompts:
        keys = producer.block_keys(TokenizedPrompt("m", (tokens_to_le32(tokens),)))[0]
        for i, endpoint in enumerate(ENDPOINTS):
            held = len(keys) if i < 3 else len(keys) * i // 16
            if held:
                producer.index.add(None, keys[:held], [PodEntry(endpoint.id, "gpu")])


#: The processing mode Envoy is configured with (``envoy-full-duplex.yaml`` / ``envoy.yaml``).
BODY_MODES = {"full-duplex": BodyMode.FULL_DUPLEX_STREAMED, "buffered": BodyMode.BUFFERED}


def request_messages(body: bytes, path: str, mode: BodyMode) -> list[ProcessingRequest]:
    """The messages Envoy sends: the body in 16 KiB chunks (FULL_DUPLEX_STREAMED) or whole (BUFFERED)."""
    hdrs = ProcessingRequest(request_headers=HttpHeaders(headers=HeaderMap(headers=[
        HeaderValue(key=":path", raw_value=path.encode()), HeaderValue(key=":method", raw_value=b"POST"),
        HeaderValue(key="content-type", raw_value=b"application/json"),
    ])))
    size = len(body) if mode == BodyMode.BUFFERED else CHUNK
    chunks = [body[i : i + size] for i in range(0, len(body), size)]
    msgs = [hdrs]
    for i, chunk in enumerate(chunks):
        msgs.append(ProcessingRequest(request_body=HttpBody(body=chunk, end_of_stream=i == len(chunks) - 1)))
    return msgs


def measure(router: Router, bodies: list[bytes], requests: int, mode: BodyMode, metrics: Metrics | None = None,
            path: str = "/v1/completions") -> tuple[list[float], float]:
    """Decision latencies (s) of ``requests`` requests, and the mean time spent on the body chunks
    before end of stream (the streamed extraction and hashing that the decision no longer waits for)."""
    return asyncio.run(_measure(router, bodies, requests, mode, metrics or Metrics(), path))


async def _measure(router: Router, bodies: list[bytes], requests: int, mode: BodyMode, metrics: Metrics,
                   path: str = "/v1/completions") -> tuple[list[float], float]:
    options = StreamOptions(default_body_mode=mode)
    routed_by = "request_body" if mode == BodyMode.BUFFERED else "request_headers"
    prepared = [request_messages(b, path, mode) for b in bodies]
    samples = []
    streaming = 0.0
    for i in range(requests + 5):
        stream = ExtProcStream(router, options, metrics)
        msgs = prepared[i % len(prepared)]
        before = time.perf_counter()
        for message in msgs[:-1]:
            await stream.handle(message)
        start = time.perf_counter()
        replies, _ = await stream.handle(msgs[-1])
        elapsed = time.perf_counter() - start
        assert replies[0].WhichOneof("response") == routed_by
        stream.close()
        if i >= 5:
            samples.append(elapsed)
            streaming += start - before
    return samples, streaming / requests


def stage_means(metrics: Metrics) -> dict[str, float]:
    """Mean seconds per decision stage, read back from the service's own histograms."""
    means = {}
    for metric in metrics.stage.collect():
        sums = {s.labels["stage"]: s.value for s in metric.samples if s.name.endswith("_sum")}
        counts = {s.labels["stage"]: s.value for s in metric.samples if s.name.endswith("_count")}
        means = {stage: sums[stage] / counts[stage] for stage in sums if counts.get(stage)}
    return means


class Ingestion(threading.Thread):
    """Applies realistic KV-event batches (decode + apply) at a paced rate of blocks per second."""

    def __init__(self, producer, blocks_per_second: int) -> None:
        super().__init__(daemon=True)
        self.producer = producer
        self.rate = blocks_per_second
        self.stop = threading.Event()
        self.applied = 0
        rng = random.Random(5)
        self.batches = []
        next_hash = 10**9
        for _ in range(20000):
            n = rng.randint(1, 8)
            event = {"type": "BlockStored", "block_hashes": list(range(next_hash, next_hash + n)),
                     "parent_block_hash": None, "token_ids": [rng.randrange(150000) for _ in range(16 * n)],
                     "block_size": 16, "medium": "GPU"}
            next_hash += n
            self.batches.append((rng.choice(ENDPOINTS).id, n, msgpack.packb([time.time(), [event], 0])))

    def run(self) -> None:
        start = time.perf_counter()
        i = 0
        while not self.stop.is_set():
            endpoint, n, payload = self.batches[i % len(self.batches)]
            self.producer.applier.apply_batch(endpoint, "m", decode_batch(payload))
            self.applied += n
            i += 1
            ahead = self.applied / self.rate - (time.perf_counter() - start)
            if ahead > 0:
                time.sleep(ahead)


#: The same pipeline with a token producer in front (``{backend}``: its parameters).
CHAT_CONFIG = CONFIG.replace(
    "plugins:\n", "plugins:\n- type: token-producer\n  parameters: {backend}\n", 1
)


def chat_body(system: str, history: list[str], question: str) -> bytes:
    messages = [{"role": "system", "content": system}]
    for i, turn in enumerate(history):
        messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": turn})
    messages.append({"role": "user", "content": question})
    return orjson.dumps({"model": "m", "messages": messages, "max_tokens": 16})


def chat_rows(args: argparse.Namespace) -> None:
    """Chat bodies routed through the token-producer, local and vllm, cold and warm."""
    mode = BODY_MODES[args.body_mode]
    from ppc_extproc.tokenizer import LocalTokenizer
    from ppc_extproc_lab.localcluster.ports import free_port
    from ppc_extproc_lab.localcluster.readiness import wait_for_http
    from ppc_extproc_lab.tiny_tokenizer import build_tiny_tokenizer
    from ppc_extproc_lab.workload.text import chars_per_token, words

    scratch = Path(tempfile.mkdtemp(prefix="bench-decision-tokenizer-"))
    build_tiny_tokenizer(scratch)
    tokenizer = LocalTokenizer.from_dir(scratch)
    ratio = chars_per_token(lambda t: list(range(len(tokenizer.encode(t, add_special_tokens=False)) // 4)))
    port = free_port()
    render = subprocess.Popen(
        [sys.executable, "-m", "ppc_extproc", "mock-vllm", "--host", "127.0.0.1", "--port", str(port),
         "--model", "m", "--tokenizer", str(scratch), "--kv-events-endpoint", ""],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_for_http(f"http://127.0.0.1:{port}/health", timeout=60)
        # "default": the embedded default configuration, which finds model m's tokenizer in the
        # Hugging Face hub cache (HF_HUB_CACHE, laid out as huggingface_hub does) with no flag.
        hub = scratch / "hub" / "models--m"
        (hub / "refs").mkdir(parents=True)
        (hub / "refs" / "main").write_text("r")
        shutil.copytree(scratch, hub / "snapshots" / "r", ignore=shutil.ignore_patterns("hub"))
        os.environ["HF_HUB_CACHE"] = str(scratch / "hub")
        every = {
            "local": f"{{local: {{tokenizerPath: {scratch}}}}}",
            "vllm": f"{{modelName: m, vllm: {{url: 'http://127.0.0.1:{port}', timeout: 30s}}}}",
            "default": None,
        }
        backends = {name: every[name] for name in args.chat_backends}
        print(f"\nChat requests (/v1/chat/completions) through the token-producer; tiny tokenizer, "
              f"{ratio:.2f} chars/token; ms from end of stream to reply")  # fmt: skip
        print(f"{'tokens':>7}  {'body KB':>7}  {'backend':>8}  {'cold p50':>9} {'p95':>7}   {'warm p50':>9} {'p95':>7}")
        for n_tokens in args.chat_sizes:
            chars = int(n_tokens * ratio * 0.8)  # the system prompt; four earlier turns add the rest
            history = [words(f"turn-{i}", chars // 16) for i in range(4)]
            for backend, params in backends.items():
                text = (default_config(args.block_size) if params is None
                        else CHAT_CONFIG.format(backend=params, block_size=args.block_size))  # fmt: skip
                loaded = load_config_text(text)
                pool = EndpointPool()
                pool.replace(ENDPOINTS)
                router = Router(pool, loaded.pipeline, inflight=loaded.services.inflight)
                producer = next(p for p in loaded.roles.producers if p.type_name == "precise-prefix-cache-producer")
                requests = max(10, args.requests // (8 if n_tokens >= 100_000 else 2))
                cold = [chat_body(words(f"cold-{backend}-{n_tokens}-{i}", chars), history, f"q {i}")
                        for i in range(requests + 5)]  # fmt: skip
                system = words(f"warm-{n_tokens}", chars)
                warm_bodies = [chat_body(system, history, f"question {i}") for i in range(requests + 5)]
                prefix = tokenizer.tokenize("chat", orjson.loads(warm_bodies[0])).prompts[0]
                warm(producer, [list(np.frombuffer(prefix, dtype="<u4")[: len(prefix) // 4 - 64])])
                cold_ms, warm_ms = asyncio.run(_chat_run(loaded, router, cold, warm_bodies, requests, mode))
                outcomes = getattr(loaded.plugins.get("token-producer"), "outcomes", None)
                assert outcomes is not None and set(outcomes) == {"ok"}, f"{backend}: not tokenized: {outcomes}"
                print(f"{len(prefix) // 4:>7}  {len(warm_bodies[0]) / 1024:>7.0f}  {backend:>8}  "
                      f"{statistics.median(cold_ms) * 1e3:9.3f} {percentile(cold_ms, 95) * 1e3:7.3f}   "
                      f"{statistics.median(warm_ms) * 1e3:9.3f} {percentile(warm_ms, 95) * 1e3:7.3f}")  # fmt: skip
    finally:
        render.terminate()
        render.wait(10)
        shutil.rmtree(scratch, ignore_errors=True)


async def _chat_run(loaded, router: Router, cold: list[bytes], warm_bodies: list[bytes],  # type: ignore[no-untyped-def]
                    requests: int, mode: BodyMode) -> tuple[list[float], list[float]]:
    """Cold then warm latencies in one event loop, with the plugins (the render client) started."""
    for plugin in loaded.roles.lifecycle:
        await plugin.start()
    try:
        path = "/v1/chat/completions"
        cold_ms, _ = await _measure(router, cold, requests, mode, Metrics(), path)
        await _measure(router, warm_bodies[:3], 3, mode, Metrics(), path)  # fill the segment caches
        warm_ms, _ = await _measure(router, warm_bodies, requests, mode, Metrics(), path)
        return cold_ms, warm_ms
    finally:
        for plugin in loaded.roles.lifecycle:
            await plugin.stop()


class AgenticLoad(threading.Thread):
    """Background traffic as an agentic workload loads the service: ``rate`` fresh 100K-token
    prompts a second, each sent to one of the engines (``engine_urls``, round robin; the prefill it
    schedules publishes its blocks, ~6,250 BlockStored blocks at block size 16, which the service
    ingests) and, as a routing request, to the ext_proc at ``address`` concurrently with the timed
    requests. No engines for the trivial ext_proc: it gets the routing requests only."""

    #: Requests sent by every instance so far: each prompt is new to every engine (see ``body``).
    count = itertools.count()

    def __init__(self, address: str, engine_urls: list[str], rate: float, bodies: list[bytes]) -> None:
        super().__init__(daemon=True)
        self.address, self.engine_urls, self.rate, self.bodies = address, engine_urls, rate, bodies
        self.stop = threading.Event()
        self.sent = 0
        self.failed = 0

    def body(self, k: int) -> bytes:
        """Request ``k``'s body: a base prompt with a first token of its own, so every block key
        differs from every earlier request's (each prefill stores all of its blocks)."""
        base = self.bodies[k % len(self.bodies)]
        at = base.index(b"[") + 1
        return base[:at] + str(1_000_000 + k).encode() + b"," + base[at:]

    def run(self) -> None:
        asyncio.run(self._run())

    async def _run(self) -> None:
        import aiohttp
        import grpc
        from _grpc_extproc import _OPTIONS, _one
        from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

        async with grpc.aio.insecure_channel(self.address, options=_OPTIONS) as channel, \
                aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:  # fmt: skip
            stub = pb_grpc.ExternalProcessorStub(channel)
            tasks: set[asyncio.Task[None]] = set()

            async def one(k: int) -> None:
                body = self.body(k)
                try:
                    calls: list[Any] = [_one(stub, body, "/v1/completions")]
                    if self.engine_urls:
                        url = self.engine_urls[k % len(self.engine_urls)] + "/v1/completions"
                        calls.append(http.post(url, data=body, headers={"content-type": "application/json"}))
                    results = await asyncio.gather(*calls)
                    for response in results[1:]:
                        assert response.status == 200, response.status
                        await response.read()
                        response.release()
                except Exception:
                    self.failed += 1

            started, sent = time.perf_counter(), 0
            while not self.stop.is_set():
                task = asyncio.create_task(one(next(self.count)))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                sent += 1
                self.sent = sent
                await asyncio.sleep(max(0.0, started + sent / self.rate - time.perf_counter()))
            await asyncio.gather(*tasks, return_exceptions=True)


def ingestion_settles(admin_url: str | None, timeout_s: float = 60.0) -> float:
    """Seconds until the service's admitted blocks stop rising (two reads 0.2 s apart agree): the
    KV events already published are ingested. ``timeout_s`` bounds the wait."""
    if admin_url is None:
        return 0.0
    started = time.perf_counter()
    last = blocks_stored(admin_url)
    while time.perf_counter() - started < timeout_s:
        time.sleep(0.2)
        now = blocks_stored(admin_url)
        if now == last:
            break
        last = now
    return time.perf_counter() - started


def blocks_stored(admin_url: str | None) -> float:
    """The blocks the service has admitted from BlockStored events (``llm_d_epp_kv_cache_index_admissions``)."""
    if admin_url is None:
        return 0.0
    import httpx

    text = httpx.get(admin_url + "/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("llm_d_epp_kv_cache_index_admissions"))  # fmt: skip


def load_bodies(count: int, n_tokens: int = 100_000) -> list[bytes]:
    """100K-token completion bodies for ``AgenticLoad`` to vary."""
    rng = np.random.default_rng(7)
    return [orjson.dumps({"model": "mock-model", "prompt": rng.integers(0, 150_000, n_tokens).tolist(),
                          "max_tokens": 1}) for _ in range(count)]  # fmt: skip


def grpc_rows(args: argparse.Namespace) -> None:
    """The shipped configuration over gRPC next to the trivial ext_proc (module docstring)."""
    import contextlib

    from _grpc_extproc import measure_grpc

    from ppc_extproc_lab.localcluster import LocalCluster
    from ppc_extproc_lab.localcluster.ports import free_port

    with contextlib.ExitStack() as stack:
        addresses: dict[str, str] = {}
        engines: dict[str, list[str]] = {}
        admin: dict[str, str | None] = {}  # a service's admin URL; None for a trivial ext_proc
        pids: dict[str, int | None] = {}
        variants: list[tuple[str, str | None]] = [("ppc-extproc", None)]
        if args.baseline_src:
            variants.append(("before", args.baseline_src))
        for name, src in variants:
            # 16 live mock engines: their KV-event subscribers connect, so the index's entries are
            # trusted (with unreachable engines every endpoint would be suspended).
            cluster = stack.enter_context(LocalCluster(
                num_engines=16, engines_per_process=16, block_size=16, num_blocks=32768, with_envoy=False,
                service_args=["--log-level", "warning"], env={"PYTHONPATH": src} if src else None,
                startup_timeout=180,
            ))  # fmt: skip
            addresses[name] = f"127.0.0.1:{cluster.grpc_ports[0]}"
            engines[name] = cluster.engine_urls
            admin[name] = cluster.service_admin_urls[0]
            pids[name] = cluster.service_process.pid  # type: ignore[union-attr]
        here = Path(__file__).parent
        trivials: list[tuple[str, Callable[[int], list[str]]]] = [
            ("trivial ext_proc", lambda port: [str(here / "_grpc_extproc.py"), "trivial", str(port)]),
            ("trivial, glibc malloc", lambda port: [str(here / "_grpc_extproc.py"), "trivial", str(port), "--glibc-malloc"]),
        ]  # fmt: skip
        if (grpclib_script := grpclib_extproc()) is not None:  # the same on pure-Python HTTP/2 (bench extra)
            trivials.append(("trivial grpclib", lambda port: [str(grpclib_script), "--grpc-port", str(port)]))
        for name, arguments in trivials:
            admin[name] = None
            port = free_port()
            trivial = subprocess.Popen([sys.executable, *arguments(port)], stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL)  # fmt: skip
            stack.callback(lambda p=trivial: (p.terminate(), p.wait(10)))  # type: ignore[misc]
            addresses[name] = f"127.0.0.1:{port}"
            engines[name] = []
            pids[name] = trivial.pid
        rng = random.Random(1)
        names = list(addresses)
        background = load_bodies(4) if args.load_rate > 0 else []
        loads = ["idle"] + ([f"load {args.load_rate:g} req/s"] if background else [])
        print("ms from sending the body message to its reply, client side; sequential requests")
        if background:
            print(f"load: {args.load_rate:g} req/s of fresh 100K-token prompts, each to one of the 16 engines (their "
                  "KV events reach that service) and as a routing request to the ext_proc measured; timed "
                  f"requests one per {args.load_interval_ms:g} ms")  # fmt: skip
        print(f"{'tokens':>7}  {'body KB':>7}  {'':>8}  " + "  ".join(f"{n + ' p50':>22} {'p99':>7}" for n in names)
              + f"  {'ours − trivial p50':>18}")  # fmt: skip
        for n_tokens in args.grpc_sizes:
            requests = args.requests if n_tokens < 100_000 else max(40, args.requests // 2)
            repeated = grpc_bodies("repeated", n_tokens, 4, rng)
            for load in loads:
                results: dict[str, list[float]] = {}
                ingested: dict[str, float] = {}
                settled: dict[str, float] = {}
                faults: dict[str, int] = {}
                for _ in range(2):  # interleaved rounds: the shared machine's load drifts
                    # Every service gets the same bodies; "fresh" and "new-tail" ones once each.
                    bodies = (repeated if args.prompts == "repeated"
                              else grpc_bodies(args.prompts, n_tokens, requests // 2 + 10, rng))  # fmt: skip
                    for name, address in addresses.items():
                        traffic, interval = None, 0.0
                        if load != "idle":  # spread over seconds, so the timed requests meet the load
                            traffic = AgenticLoad(address, engines[name], args.load_rate, background)
                            before, since = blocks_stored(admin[name]), time.perf_counter()
                            traffic.start()
                            time.sleep(2.0)  # the load reaches its steady state first
                            interval = args.load_interval_ms / 1e3
                        try:
                            faulted = minor_faults(pids[name])
                            results.setdefault(name, []).extend(measure_grpc(address, bodies, requests // 2,
                                                                             interval=interval))
                            faults[name] = faults.get(name, 0) + minor_faults(pids[name]) - faulted
                        finally:
                            if traffic is not None:
                                traffic.stop.set()
                                traffic.join(60)
                                assert traffic.failed == 0, f"{name}: {traffic.failed} background requests failed"
                                rate = (blocks_stored(admin[name]) - before) / (time.perf_counter() - since)
                                ingested[name] = max(ingested.get(name, 0.0), rate)
                                # The next phase is idle only once the service has ingested the
                                # load's KV events: its backlog would share the GIL with it.
                                settled[name] = max(settled.get(name, 0.0), ingestion_settles(admin[name]))
                cells = [f"{statistics.median(results[n]) * 1e3:22.3f} {percentile(results[n], 99) * 1e3:7.3f}"
                         for n in names]  # fmt: skip
                extra = statistics.median(results["ppc-extproc"]) - statistics.median(results["trivial ext_proc"])
                print(f"{n_tokens:>7}  {len(repeated[0]) / 1024:>7.0f}  {load.split(' ')[0]:>8}  " + "  ".join(cells)
                      + f"  {extra * 1e3:+18.3f}", flush=True)  # fmt: skip
                print(f"{'':>27}page faults per request (minor, whole process, warm-up included): "
                      + ", ".join(f"{n} {v / len(results[n]):.1f}" for n, v in faults.items()))  # fmt: skip
                if ingested:
                    print(f"{'':>27}blocks stored/s ingested: "
                          + ", ".join(f"{n} {v:,.0f}" for n, v in ingested.items() if admin[n])
                          + "; backlog ingested after the load stopped, in s (longest of 2): "
                          + ", ".join(f"{n} {v:.1f}" for n, v in settled.items() if admin[n]))  # fmt: skip


def grpc_bodies(kind: str, n_tokens: int, count: int, rng: random.Random) -> list[bytes]:
    """``count`` completion bodies of ``n_tokens`` token ids: "repeated" (sent in turn, each again
    and again), "fresh" (nothing shared) or "new-tail" (one shared prefix, then 1,024 tokens of
    their own: the next turns of agentic sessions)."""
    np_rng = np.random.default_rng(rng.randrange(2**32))

    def body(tokens: np.ndarray) -> bytes:  # type: ignore[type-arg]
        return orjson.dumps({"model": "mock-model", "prompt": tokens, "max_tokens": 16}, option=orjson.OPT_SERIALIZE_NUMPY)

    if kind == "new-tail":
        tail = min(1024, n_tokens)
        prefix = np_rng.integers(0, 150_000, n_tokens - tail, dtype=np.int64)
        return [body(np.concatenate([prefix, np_rng.integers(0, 150_000, tail, dtype=np.int64)])) for _ in range(count)]
    return [body(np_rng.integers(0, 150_000, n_tokens, dtype=np.int64)) for _ in range(count)]


def minor_faults(pid: int | None) -> int:
    """Minor page faults of process ``pid`` so far (``/proc/<pid>/stat`` field 10): first touches
    of fresh pages."""
    if pid is None:
        return 0
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[7])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--part", choices=["grpc", "inproc"], default="grpc")
    parser.add_argument("--baseline-src", help="grpc part: also serve this checkout's src (e.g. before a change)")
    parser.add_argument("--grpc-sizes", type=lambda t: [int(x) for x in t.split(",")],
                        default=[1_000, 8_000, 32_000, 100_000, 200_000])  # fmt: skip
    parser.add_argument("--prompts", choices=("repeated", "fresh", "new-tail"), default="repeated",
                        help="grpc part: 4 prompts in turn, a new prompt every request, or one long prefix with a "
                             "new 1,024-token tail every request")  # fmt: skip
    parser.add_argument("--load-rate", type=float, default=0.0,
                        help="grpc part: also measure under agentic load, this many 100K-token requests/s (e.g. 3)")
    parser.add_argument("--load-interval-ms", type=float, default=40.0,
                        help="grpc part under load: one timed request started per this many ms")
    parser.add_argument("--block-size", type=int, default=64)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--skip-tokens", action="store_true", help="only the chat rows")
    parser.add_argument("--skip-chat", action="store_true", help="only the token-id rows")
    parser.add_argument("--chat-sizes", type=lambda t: [int(x) for x in t.split(",")],
                        default=[8_000, 32_000, 100_000, 200_000])  # fmt: skip
    parser.add_argument("--config", choices=("bench", "default"), default="bench",
                        help="token-id rows: this benchmark's pipeline, or the embedded default configuration")
    parser.add_argument("--chat-backends", type=lambda t: t.split(","), default=["local", "vllm"],
                        help="chat rows: local (tokenizerPath), vllm (render endpoint), default (embedded config, HF cache)")
    parser.add_argument("--body-mode", choices=sorted(BODY_MODES), default="full-duplex",
                        help="how Envoy sends the body: chunks as they arrive, or whole (envoy.yaml)")  # fmt: skip
    args = parser.parse_args()
    configure_logging("console", "warning")
    if args.part == "grpc":
        header("Decision latency over gRPC, shipped configuration (serve, no config file: block size 16; "
               "16 endpoints; BUFFERED body)")
        grpc_rows(args)
        return
    header(f"Decision latency, in-process (block size {args.block_size}, 16 endpoints, {args.body_mode} body, "
           f"{args.config} config for token ids)")
    if not args.skip_tokens:
        token_rows(args)
    if not args.skip_chat:
        chat_rows(args)


def token_rows(args: argparse.Namespace) -> None:
    mode = BODY_MODES[args.body_mode]
    rng = random.Random(1)
    print(f"{'tokens':>7}  {'body KB':>7}  {'idle p50':>9} {'p95':>7} {'p99':>7}   {'+50k blk/s p50':>14} {'p95':>7} {'p99':>7}")
    breakdown = []
    for n_tokens in (1_000, 8_000, 32_000, 100_000):
        router, producer = build_router(args.block_size, args.config)
        prompts = [[rng.randrange(150_000) for _ in range(n_tokens)] for _ in range(4)]
        warm(producer, prompts)
        bodies = [orjson.dumps({"model": "m", "prompt": p, "max_tokens": 16}) for p in prompts]
        requests = args.requests if n_tokens < 100_000 else max(50, args.requests // 2)
        metrics = Metrics()
        idle, streamed = measure(router, bodies, requests, mode, metrics)
        breakdown.append((n_tokens, stage_means(metrics), streamed))
        ingestion = Ingestion(producer, 50_000)
        ingestion.start()
        busy, _ = measure(router, bodies, requests, mode)
        ingestion.stop.set()
        ingestion.join()
        row = [statistics.median(idle), percentile(idle, 95), percentile(idle, 99),
               statistics.median(busy), percentile(busy, 95), percentile(busy, 99)]
        print(f"{n_tokens:>7}  {len(bodies[0]) / 1024:>7.0f}  " + " ".join(f"{v * 1e3:7.3f}" for v in row[:3])
              + "   " + f"{row[3] * 1e3:14.3f} " + " ".join(f"{v * 1e3:7.3f}" for v in row[4:]) + "  ms")
    print("\nWhere the time goes (idle, mean ms per decision; 'streamed' = work done on the body chunks")
    print("before end of stream, which the decision does not wait for):")
    stages = ("parse", "keys", "lookup", "score", "pre_request")
    print(f"{'tokens':>7}  " + " ".join(f"{s:>11}" for s in stages) + f" {'streamed':>9}")
    for n_tokens, means, streamed in breakdown:
        print(f"{n_tokens:>7}  " + " ".join(f"{means.get(s, 0.0) * 1e3:11.3f}" for s in stages) + f" {streamed * 1e3:9.3f}")
    print("\n(time from the request body's end-of-stream message to the routing reply, in ms)")


if __name__ == "__main__":
    main()
