"""What routing costs: CPU per request for the service and Envoy, throughput, latency,
memory and idle CPU against the number of endpoints — next to vllm-router and sglang-router, all
in one run on this machine.

    python benchmarks/bench_scale.py                       # every part (~10 min on 2 cores)
    python benchmarks/bench_scale.py --parts streamed      # one part: streamed, small, idle
    python benchmarks/bench_scale.py --parts small --workers 1,2 --peers vllm-router,sglang-router
    python benchmarks/bench_scale.py --parts streamed --variants buffered --pace-ms 20 --peers ''   # paced

Parts:

* ``streamed``: 16 mock engines (one process, each on its own loopback address with its own cache,
  KV-event socket and /metrics) behind Envoy + the service, both shipped Envoy configs
  (``envoy.yaml``, BUFFERED request bodies and no response bodies; ``envoy-full-duplex.yaml``);
  workloads: agentic (100K-token prompts sharing 95K per session, 1,000 and 32 streamed output
  tokens), chat at 8K tokens (64 streamed), 2K-token prompts with 32 streamed tokens (also through
  the peer routers: token ids to vllm-router, text to sglang-router, which rejects ids with 422);
  per process CPU-seconds per request from /proc, decision p50/p99 (the service's histogram), RSS.
  The engines stream one SSE event per token (``--stream-interval-ms 0``), as vLLM does, one every
  2 ms; ``--pace-ms 20`` writes one every 20 ms, as a real decode of a large model streams them
  (each 1K-token answer then keeps its stream open 20 s), for the agentic 100K/1K and chat 8K
  workloads only (``--paced``: both, with the "Envoy alone" rows). The agentic 100K/1K workload
  keeps 4 requests open at once (a quarter of the engines busy); ``--streams 16`` keeps one per
  engine, which shows what of a request's cost is per request and what is per second of wall time.
  ``--trivial`` adds the same workloads with the trivial grpc.aio ext_proc
  (``tests/unit/localcluster/stub_extproc.py``, round robin, no KV events) in the service's place:
  what any Python grpc.aio ext_proc pays for them, paced or not; and, with grpclib installed (the
  ``bench`` extra), the same on grpclib (``_grpclib_extproc.py``: pure-Python HTTP/2, none of grpc
  C-core's threads), which tells grpcio's share from Python's.
* ``chat``: the 2K/32 workload as OpenAI chat messages (``/v1/chat/completions``): the engines
  tokenise with a byte-level BPE built at run time, our local ``token-producer`` with the same
  files; the peers get the same chats.
* ``small``: 1,000-token prompts, one output token, against an Envoy ``direct_response`` upstream on
  16 loopback addresses (so the upstream costs ~nothing and the router is what is measured), with
  ``wrk``: the highest sustained req/s at c=32 and CPU per 1k requests, with 1 and 2 service workers
  (``serve --workers``; Envoy ``--concurrency`` matches), and p50 latency at c=1 added over the
  upstream reached directly. Same for the peers.
* ``idle``: idle CPU of the service over 20 s with N = 16, 100, 256 mock engines in one process,
  with the default configuration (in-flight load, nothing polled) and with engine-metrics scoring
  (``kv-cache-utilization-scorer`` + ``queue-scorer``: /metrics polled, adaptive interval).

Needs ``wrk`` (Debian package) for ``small`` and the ``bench`` extra for the peers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import shutil
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import yaml

sys.path.insert(0, str(Path(__file__).parent))
from _common import WRK_SCRIPT, grpclib_extproc, header, run_wrk

from ppc_extproc_lab.localcluster import (
    LocalCluster,
    ProcessGroup,
    default_service_config,
    find_envoy,
    free_port,
    loopback_ips,
    render_envoy_config,
    wait_for_grpc_health,
    wait_for_http,
)
from ppc_extproc_lab.workload.peers import PEERS, PeerDeployment
from ppc_extproc_lab.workload.policies import policy
from ppc_extproc_lab.workload.probes import tree_cpu_seconds, tree_rss_bytes

MODEL = "mock-model"
#: Block size of the engines and of the service (``--block-size``; the shipped configuration's 16).
BLOCK = 16
#: Engine KV blocks: the same token capacity at every block size.
NUM_BLOCKS = 8192 * 64 // BLOCK
ENGINE_ARGS = [
    "--prefill-tokens-per-s", "2000000", "--decode-ms-per-token", "2", "--stream-interval-ms", "0",
    "--max-num-seqs", "64", "--log-level", "warning",
]  # fmt: skip


# --- /proc --------------------------------------------------------------------------------------


cpu_seconds = tree_cpu_seconds
rss_bytes = tree_rss_bytes


# --- the service's decision histogram ------------------------------------------------------------


def _buckets(admin_urls: Sequence[str]) -> dict[float, float]:
    merged: dict[float, float] = {}
    pattern = re.compile(r'^ppc_extproc_decision_duration_seconds_bucket\{le="([^"]+)"\} (\S+)$')
    for url in admin_urls:
        try:
            with urllib.request.urlopen(url + "/metrics", timeout=5) as response:
                text = response.read().decode()
        except OSError:
            continue
        for line in text.splitlines():
            if m := pattern.match(line):
                le = float(m.group(1))
                merged[le] = merged.get(le, 0.0) + float(m.group(2))
    return merged


def _quantile_le(before: Mapping[float, float], after: Mapping[float, float], q: float) -> float:
    delta = {le: after[le] - before.get(le, 0.0) for le in after}
    count = delta.get(float("inf"), 0.0)
    if count <= 0:
        return float("nan")
    return next(le for le, n in sorted(delta.items()) if n >= q * count)


# --- load ---------------------------------------------------------------------------------------


async def _drive(url: str, bodies: Sequence[bytes], concurrency: int) -> tuple[list[float], int]:
    """POST every body (``concurrency`` at a time), read each response to its end; latencies, errors."""
    latencies: list[float] = []
    errors = 0
    queue = list(reversed(bodies))
    connector = aiohttp.TCPConnector(limit=concurrency, force_close=False)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=600)) as session:

        async def worker() -> None:
            nonlocal errors
            while queue:
                data = queue.pop()
                started = time.perf_counter()
                try:
                    async with session.post(url, data=data, headers={"content-type": "application/json"}) as r:
                        async for _ in r.content.iter_any():
                            pass
                        if r.status != 200:
                            errors += 1
                except aiohttp.ClientError:
                    errors += 1
                latencies.append(time.perf_counter() - started)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies, errors


@dataclass
class Measured:
    requests: int
    wall_s: float
    cpu_s: dict[str, float]
    rss: dict[str, int]
    errors: int
    latencies: list[float] = field(default_factory=list)
    decision_p50: float = float("nan")
    decision_p99: float = float("nan")

    def ms_per_request(self, name: str) -> float:
        return self.cpu_s.get(name, float("nan")) / max(1, self.requests) * 1e3


def idle_cores(pid: int, seconds: float) -> float:
    """Cores ``pid`` uses doing nothing (housekeeping, KV-event sockets): subtracted to give a
    request's marginal cost. Summed over the threads' ``schedstat`` (ns): ``/proc/<pid>/stat``
    counts 10 ms ticks, one tick in a 3 s window is 3.3 ms/s (17 ms per paced request)."""
    before, started = sum(ns for ns, _ in thread_cpu_ns(pid).values()), time.perf_counter()
    time.sleep(seconds)
    used = sum(ns for ns, _ in thread_cpu_ns(pid).values()) - before  # a thread gone since: not counted
    return max(0.0, used / 1e9) / (time.perf_counter() - started)


def thread_cpu_ns(pid: int) -> dict[tuple[int, str], tuple[int, int]]:
    """Per-thread CPU time of ``pid`` (``/proc/<pid>/task/*/schedstat``: ns on CPU, time slices
    run, i.e. wake-ups), keyed by (tid, comm)."""
    out: dict[tuple[int, str], tuple[int, int]] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "schedstat").read_text().split()
            comm = (task / "comm").read_text().strip()
        except (OSError, ValueError, IndexError):
            continue
        out[(int(task.name), comm)] = (int(fields[0]), int(fields[2]))
    return out


def print_thread_cpu(pid: int, before: Mapping[tuple[int, str], tuple[int, int]], requests: int, wall_s: float,
                     idle_before: Mapping[tuple[int, str], tuple[int, int]], idle_s: float) -> None:  # fmt: skip
    """Service threads' CPU ms and wake-ups per request over the measured run, and ms/s over the
    idle window before it; the main thread is the one whose tid is the pid."""
    after = thread_cpu_ns(pid)
    rows = []
    for key, (ns, slices) in after.items():
        ns0, slices0 = before.get(key, (0, 0))
        used = (ns - ns0) / 1e6 / max(1, requests)
        wakes = (slices - slices0) / max(1, requests)
        idle_ns = ns0 - idle_before.get(key, (0, 0))[0]
        rows.append((used, key, wakes, idle_ns / 1e6 / idle_s if idle_s > 0 else float("nan")))
    rows.sort(reverse=True)
    print(f"\nservice threads over {requests} requests ({wall_s:.1f} s): ms/req, wake-ups/req, ms/s idle before")
    for used, (tid, comm), wakes, idle_ms in rows:
        if used >= 0.05 or idle_ms >= 0.05:
            label = "main" if tid == pid else comm
            print(f"    {label:<18} tid {tid:<8} {used:8.2f} ms/req {wakes:8.0f} wake-ups/req   idle {idle_ms:6.2f} ms/s")
    print()


def measure(url: str, bodies: Sequence[bytes], concurrency: int, pids: Mapping[str, int],
            admin_urls: Sequence[str] = ()) -> Measured:  # fmt: skip
    before_cpu = {n: cpu_seconds(p) for n, p in pids.items()}
    before_hist = _buckets(admin_urls) if admin_urls else {}
    started = time.perf_counter()
    latencies, errors = asyncio.run(_drive(url, bodies, concurrency))
    wall = time.perf_counter() - started
    time.sleep(0.3)  # let the last streams close (in-flight accounting, KV events)
    cpu = {n: cpu_seconds(p) - before_cpu[n] for n, p in pids.items()}
    out = Measured(len(bodies), wall, cpu, {n: rss_bytes(p) for n, p in pids.items()}, errors, latencies)
    if admin_urls:
        after = _buckets(admin_urls)
        out.decision_p50 = _quantile_le(before_hist, after, 0.5)
        out.decision_p99 = _quantile_le(before_hist, after, 0.99)
    return out


# --- workloads ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    name: str
    prompt_tokens: int
    shared_tokens: int
    output_tokens: int
    requests: int
    concurrency: int
    sessions: int = 8

    def bodies(self, seed: int, *, text: bool = False, count: int | None = None) -> list[bytes]:
        """Token-id bodies (``text``: the same lengths as ASCII text, which the mock reads as one
        id per byte) cycling over the sessions; each request's tail is new."""
        rng = random.Random(seed)
        prefixes = [[rng.randrange(1, 150_000) for _ in range(self.shared_tokens)] for _ in range(self.sessions)]
        out = []
        for i in range(count if count is not None else self.requests):
            tail = [rng.randrange(1, 150_000) for _ in range(self.prompt_tokens - self.shared_tokens)]
            ids = prefixes[i % self.sessions] + tail
            prompt: Any = "".join(chr(97 + t % 26) for t in ids) if text else ids
            out.append(orjson.dumps({"model": MODEL, "prompt": prompt, "max_tokens": self.output_tokens,
                                     "stream": True, "stream_options": {"include_usage": True}}))  # fmt: skip
        return out


_WORDS = ("the", "request", "router", "keeps", "every", "session", "on", "engine", "that", "cached", "its",
          "context", "while", "load", "stays", "balanced", "across", "pods", "tokens", "blocks", "prefix", "cache",
          "hit", "rate", "latency", "agent", "tool", "call", "result", "answer", "question", "system", "user")


def chat_bodies(count: int, shared_chars: int, tail_chars: int, output_tokens: int, seed: int, sessions: int = 8) -> list[bytes]:
    """OpenAI chat bodies: a per-session system message (shared) and a new user message."""
    rng = random.Random(seed)

    def text(chars: int) -> str:
        out: list[str] = []
        size = 0
        while size < chars:
            out.append(rng.choice(_WORDS))
            size += len(out[-1]) + 1
        return " ".join(out)

    systems = [text(shared_chars) for _ in range(sessions)]
    return [orjson.dumps({"model": MODEL, "messages": [{"role": "system", "content": systems[i % sessions]},
                                                       {"role": "user", "content": text(tail_chars)}],
                          "max_tokens": output_tokens, "stream": True, "stream_options": {"include_usage": True}})
            for i in range(count)]  # fmt: skip


def part_chat(args: argparse.Namespace, work: Path) -> None:
    """2K-token chats with 32 streamed tokens as /v1/chat/completions messages: the engines and our
    token-producer tokenise with the same tiny byte-level BPE (built at run time)."""
    from ppc_extproc_lab.tiny_tokenizer import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer(work / "tokenizer")
    print("## Chat form: /v1/chat/completions, ~2K-token chats (1.5K-token system message per session), 32 "
          "streamed tokens; engines and ppc-extproc's local token-producer share a byte-level BPE\n")
    print("| router | config | requests | CPU ms/req service (minus idle) | CPU ms/req Envoy (router) | total | "
          "decision p50 / p99 ms (≤) | req/s | errors |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    bodies = chat_bodies(400, 4_700, 1_550, 32, 1)
    warm = chat_bodies(8, 4_700, 1_550, 32, 99)
    with LocalCluster(num_engines=16, engines_per_process=16, model=MODEL, block_size=BLOCK, num_blocks=NUM_BLOCKS,
                      engine_args=ENGINE_ARGS, envoy_variant=args.variants[0], envoy_args=["--concurrency", "1"],
                      service_args=["--log-level", "warning"], tokenizer=tokenizer, log_dir=work / "chat",
                      keep_logs=True) as cluster:  # fmt: skip
        assert cluster.service_process is not None and cluster.envoy_process is not None
        pids = {"service": cluster.service_process.pid or 0, "envoy": cluster.envoy_process.pid or 0}
        url = cluster.listener_url + "/v1/chat/completions"
        measure(url, warm, 8, pids)
        idle = idle_cores(pids["service"], 3.0)
        m = measure(url, bodies, 8, pids, cluster.service_admin_urls)
        svc, env = m.ms_per_request("service"), m.ms_per_request("envoy")
        print(f"| ppc-extproc | {args.variants[0]} + local token-producer | {m.requests} | {_fmt(svc)} "
              f"({_fmt(svc - idle * m.wall_s / m.requests * 1e3)}) | {_fmt(env)} | {_fmt(svc + env)} | "
              f"{_fmt(m.decision_p50 * 1e3, 3)} / {_fmt(m.decision_p99 * 1e3, 3)} | {m.requests / m.wall_s:.1f} | "
              f"{m.errors} |", flush=True)  # fmt: skip
        for name in args.peers:
            router = PEERS[name]
            with PeerDeployment(router, cluster.engine_urls, log_dir=work / f"chat-{name}") as peer:
                ppids = {"router": peer.processes[0].pid or 0}
                measure(peer.url + "/v1/chat/completions", warm, 8, ppids)
                m = measure(peer.url + "/v1/chat/completions", bodies, 8, ppids)
                cpu = m.ms_per_request("router")
                print(f"| {name} {router.version()} | cache_aware | {m.requests} | - | {_fmt(cpu)} | {_fmt(cpu)} | - | "
                      f"{m.requests / m.wall_s:.1f} | {m.errors} |", flush=True)  # fmt: skip
    print()


STREAMED = [
    Workload("agentic 100K/1K", 100_000, 95_000, 1000, 24, 4),
    Workload("agentic 100K/32", 100_000, 95_000, 32, 24, 4),
    Workload("chat 8K/64", 8_000, 6_000, 64, 96, 8),
    Workload("2K/32", 2_000, 1_500, 32, 400, 8),
]


def with_streams(w: Workload, streams: int) -> Workload:
    """``w`` with ``streams`` requests open at once: as many rounds of them as ``w`` has, and at
    least one session per stream, so a fuller pool is what changes, not the prefix sharing."""
    rounds = max(1, w.requests // w.concurrency)
    return replace(w, name=f"{w.name}, {streams} at a time", concurrency=streams, requests=rounds * streams,
                   sessions=max(w.sessions, streams))


def envoy_without_ext_proc(rendered: Path, engines: Sequence[str], out: Path) -> Path:
    """The rendered shipped config minus the ext_proc (and header-mutation) filter, routing round
    robin over ``engines``: what Envoy itself costs to proxy the same traffic."""
    config = yaml.safe_load(rendered.read_text())
    hcm = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    hcm["http_filters"] = [f for f in hcm["http_filters"] if f["name"] == "envoy.filters.http.router"]
    hcm["route_config"]["virtual_hosts"][0]["routes"][0]["route"]["cluster"] = "engines"
    members = [{"endpoint": {"address": {"socket_address": {"address": e.rsplit(":", 1)[0],
                                                            "port_value": int(e.rsplit(":", 1)[1])}}}} for e in engines]
    config["static_resources"]["clusters"].append({
        "name": "engines", "type": "STATIC", "lb_policy": "ROUND_ROBIN", "connect_timeout": "5s",
        "load_assignment": {"cluster_name": "engines", "endpoints": [{"lb_endpoints": members}]},
    })  # fmt: skip
    out.write_text(yaml.safe_dump(config, sort_keys=False))
    return out


def start_py_spy(args: argparse.Namespace, pid: int, work: Path, workload: str) -> Any:
    """``py-spy record`` on the service during one measured run (``--py-spy DIR``), or None."""
    if not args.py_spy:
        return None
    import subprocess

    out = Path(args.py_spy) / f"{workload.replace(' ', '_').replace('/', '-')}-{args.pace_ms:g}ms.txt"
    out.parent.mkdir(parents=True, exist_ok=True)
    argv = ["py-spy", "record", "--threads", "--nonblocking", "-f", "raw", "-o", str(out),
            "-p", str(pid), *args.py_spy_flags.split()]  # fmt: skip
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def stop_py_spy(proc: Any) -> None:
    if proc is None:
        return
    import signal

    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=30)
    except Exception:
        proc.kill()
        proc.wait()


def _fmt(value: float, digits: int = 2) -> str:
    return "-" if value != value else f"{value:,.{digits}f}"


#: The floor of any Python grpc.aio ext_proc: routes round robin, nothing else (no KV events).
STUB_EXTPROC = Path(__file__).resolve().parents[1] / "tests/unit/localcluster/stub_extproc.py"


def trivial_ext_procs() -> list[tuple[str, Path]]:
    """The trivial ext_procs to run next to the service: grpc.aio's, and grpclib's (pure-Python
    HTTP/2, no grpc C-core threads: what is grpcio's, not Python's) when installed."""
    trivials = [("trivial grpc.aio ext_proc (round robin)", STUB_EXTPROC)]
    if (grpclib_script := grpclib_extproc()) is not None:
        trivials.append(("trivial grpclib ext_proc (round robin)", grpclib_script))
    return trivials


def streamed_cluster(args: argparse.Namespace, work: Path, variant: str, name: str, **options: Any) -> LocalCluster:
    """The streamed part's cluster: ``args.engines`` engines in one process behind Envoy
    (``variant``) and the service, or what ``options`` puts in its place."""
    return LocalCluster(num_engines=args.engines, engines_per_process=args.engines, model=MODEL, block_size=BLOCK,
                        num_blocks=NUM_BLOCKS, engine_args=ENGINE_ARGS, envoy_variant=variant, startup_timeout=180,
                        envoy_args=["--concurrency", "1"], log_dir=work / name, keep_logs=True, **options)  # fmt: skip


def print_row(router: str, variant: str, w: Workload, m: Measured, idle: float) -> None:
    """One row of the streamed table; the service's CPU also minus its idle burn over the run."""
    svc, env = m.ms_per_request("service"), m.ms_per_request("envoy")
    marginal = svc - idle * m.wall_s / m.requests * 1e3
    print(f"| {router} | {variant} | {w.name} | {m.requests} | {_fmt(svc)} ({_fmt(marginal)}) | {_fmt(env)} | "
          f"{_fmt(svc + env)} | {_fmt(m.decision_p50 * 1e3, 3)} / {_fmt(m.decision_p99 * 1e3, 3)} | "
          f"{m.rss['service'] / 2**20:.0f} / {m.rss['envoy'] / 2**20:.0f} | "
          f"{m.requests / m.wall_s:.1f} | {m.errors} |", flush=True)  # fmt: skip


def trivial_rows(args: argparse.Namespace, work: Path, variant: str, workloads: Sequence[Workload]) -> None:
    """The same workloads with the trivial ext_proc in the service's place (``--trivial``): what a
    paced stream costs a Python ext_proc that does nothing but answer, next to the service's row."""
    for name, script in trivial_ext_procs():
        service_command = [sys.executable, str(script)]
        with streamed_cluster(args, work, variant, f"streamed-{script.stem}-{variant}",
                              service_command=service_command) as cluster:  # fmt: skip
            assert cluster.service_process is not None and cluster.envoy_process is not None
            pids = {"service": cluster.service_process.pid or 0, "envoy": cluster.envoy_process.pid or 0}
            url = cluster.listener_url + "/v1/completions"
            for w in workloads:
                measure(url, w.bodies(99, count=w.sessions), w.concurrency, pids)
                idle = idle_cores(pids["service"], args.idle_window_s)
                print_row(name, variant, w, measure(url, w.bodies(1), w.concurrency, pids), idle)


def part_streamed(args: argparse.Namespace, work: Path) -> None:
    print(f"## Streamed workloads: {args.engines} mock engines behind Envoy + the service (or a peer router)\n")
    print(f"engines: {' '.join(ENGINE_ARGS)}; block size {BLOCK}; service: the default configuration "
          "(precise + speculative, prefix 3 + active-request 2), 1 worker; Envoy --concurrency 1\n")
    print("| router | config | workload | requests | CPU ms/req service (minus idle) | CPU ms/req Envoy (router) | total | "
          "decision p50 / p99 ms (≤) | RSS MB service / Envoy | req/s | errors |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    workloads = [w for w in STREAMED if not args.quick or w.name != "chat 8K/64"]
    if args.pace_ms >= 10 or args.long_only:  # answers that take seconds: the long-stream workloads only
        workloads = [w for w in workloads if w.name in ("agentic 100K/1K", "chat 8K/64")]
    if args.streams:
        workloads = [with_streams(w, args.streams) if w.name == "agentic 100K/1K" else w for w in workloads]
    for variant in args.variants:
        service_args = ["--log-level", "warning", "--usage-sample-rate", str(args.usage_sample_rate)]
        with streamed_cluster(args, work, variant, f"streamed-{variant}", service_args=service_args) as cluster:
            assert cluster.service_process is not None and cluster.envoy_process is not None
            pids = {"service": cluster.service_process.pid or 0, "envoy": cluster.envoy_process.pid or 0}
            url = cluster.listener_url + "/v1/completions"
            for w in workloads:
                measure(url, w.bodies(99, count=w.sessions), w.concurrency, pids)  # warm: sessions cached
                idle_threads = thread_cpu_ns(pids["service"]) if args.threads else {}
                idle = idle_cores(pids["service"], args.idle_window_s)
                threads = thread_cpu_ns(pids["service"]) if args.threads else {}
                spy = start_py_spy(args, pids["service"], work, w.name)
                m = measure(url, w.bodies(1), w.concurrency, pids, cluster.service_admin_urls)
                stop_py_spy(spy)
                print_row("ppc-extproc", variant, w, m, idle)
                if args.threads:
                    print_thread_cpu(pids["service"], threads, m.requests, m.wall_s, idle_threads, args.idle_window_s)
            if variant != args.variants[0] or cluster.envoy_config_path is None:
                continue
            if args.trivial:
                trivial_rows(args, work, variant, workloads)
            # Envoy's own cost for the same traffic: the same file without ext_proc, round robin.
            plain = envoy_without_ext_proc(cluster.envoy_config_path, cluster.engine_endpoints, work / "plain.yaml")
            listen, admin = free_port(), free_port()
            config = yaml.safe_load(plain.read_text())
            config["admin"]["address"]["socket_address"]["port_value"] = admin
            config["static_resources"]["listeners"][0]["address"]["socket_address"]["port_value"] = listen
            plain.write_text(yaml.safe_dump(config, sort_keys=False))
            group = ProcessGroup(work / "plain")
            try:
                proxy = group.spawn("envoy-plain", [find_envoy(), "-c", str(plain), "--disable-hot-restart",
                                                    "--log-level", "error", "--concurrency", "1"])  # fmt: skip
                wait_for_http(f"http://127.0.0.1:{admin}/ready")
                plain_url = f"http://127.0.0.1:{listen}/v1/completions"
                for w in workloads:
                    measure(plain_url, w.bodies(99, count=w.sessions), w.concurrency, {})
                    m = measure(plain_url, w.bodies(1), w.concurrency, {"envoy": proxy.pid or 0})
                    env = m.ms_per_request("envoy")
                    print(f"| Envoy alone (no ext_proc, round robin) | {variant} minus ext_proc | {w.name} | "
                          f"{m.requests} | - | {_fmt(env)} | {_fmt(env)} | - | - / {m.rss['envoy'] / 2**20:.0f} | "
                          f"{m.requests / m.wall_s:.1f} | {m.errors} |", flush=True)  # fmt: skip
            finally:
                group.stop_all()
    if not args.peers:
        return
    peer_workloads = [x for x in STREAMED if x.name in ("2K/32", "agentic 100K/1K")]
    if args.pace_ms >= 10:
        peer_workloads = [x for x in peer_workloads if x.name == "agentic 100K/1K"]
    with LocalCluster(num_engines=args.engines, engines_per_process=args.engines, model=MODEL, block_size=BLOCK,
                      num_blocks=NUM_BLOCKS, engine_args=ENGINE_ARGS, with_service=False, startup_timeout=180, log_dir=work / "streamed-peers",
                      keep_logs=True) as cluster:  # fmt: skip
        for name in args.peers:
            router = PEERS[name]
            text = not router.accepts_token_ids
            with PeerDeployment(router, cluster.engine_urls, log_dir=work / f"peer-{name}") as peer:
                pids = {"router": peer.processes[0].pid or 0}
                for w in peer_workloads:
                    measure(peer.url + "/v1/completions", w.bodies(99, text=text, count=w.sessions), w.concurrency, pids)
                    m = measure(peer.url + "/v1/completions", w.bodies(1, text=text), w.concurrency, pids)
                    cpu = m.ms_per_request("router")
                    print(f"| {name} {router.version()} | cache_aware | {w.name} {'text' if text else 'ids'} | "
                          f"{m.requests} | - | {_fmt(cpu)} | {_fmt(cpu)} | - | - / {m.rss['router'] / 2**20:.0f} | "
                          f"{m.requests / m.wall_s:.1f} | {m.errors} |", flush=True)  # fmt: skip
    print()


# --- small requests through wrk -----------------------------------------------------------------

COMPLETION = ('{"id":"cmpl-1","object":"text_completion","model":"mock-model","choices":[{"index":0,"text":"ok",'
              '"finish_reason":"length"}],"usage":{"prompt_tokens":1000,"completion_tokens":1,"total_tokens":1001,'
              '"prompt_tokens_details":{"cached_tokens":0}}}')  # fmt: skip


def _listener(name: str, ip: str, port: int) -> dict[str, Any]:
    hcm = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
    return {
        "name": name, "address": {"socket_address": {"address": ip, "port_value": port}},
        "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": {
            "@type": hcm, "stat_prefix": name,
            "route_config": {"virtual_hosts": [{"name": "all", "domains": ["*"], "routes": [{
                "match": {"prefix": "/"}, "direct_response": {"status": 200, "body": {"inline_string": COMPLETION}},
                "response_headers_to_add": [{"header": {"key": "content-type", "value": "application/json"}}]}]}]},
            "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}],
        }}]}],
    }  # fmt: skip


def part_small(args: argparse.Namespace, work: Path) -> None:
    if shutil.which("wrk") is None:
        print("## Small requests: skipped (wrk not found: apt-get install wrk)\n")
        return
    envoy = find_envoy()
    rng = random.Random(1)
    body = work / "small.json"
    body.write_bytes(orjson.dumps({"model": MODEL, "prompt": [rng.randrange(150000) for _ in range(1000)], "max_tokens": 1}))
    script = work / "post.lua"
    script.write_text(WRK_SCRIPT.format(body=body))
    print(f"## Small requests: 1,000-token prompts ({body.stat().st_size:,} bytes), 1 output token, 16 upstreams "
          f"(Envoy direct_response); wrk {args.seconds:g} s per cell\n")
    print("| router | workers | req/s c=32 | CPU s per 1k req (router process[es] + Envoy) | of which Envoy | "
          "p50 c=1 ms | added p50 ms | p99 c=1 ms | errors |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    group = ProcessGroup(work / "small")
    try:
        ips = loopback_ips(16, first=2)
        port, admin = free_port(ips[0]), free_port()
        config = {"admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin}}},
                  "static_resources": {"listeners": [_listener(f"u{i}", ip, port) for i, ip in enumerate(ips)]}}
        (work / "upstream.yaml").write_text(yaml.safe_dump(config))
        group.spawn("upstream", [envoy, "-c", str(work / "upstream.yaml"), "--disable-hot-restart", "--log-level", "error",
                                 "--concurrency", "2"])  # fmt: skip
        wait_for_http(f"http://127.0.0.1:{admin}/ready")
        endpoints = [f"{ip}:{port}" for ip in ips]
        direct = run_wrk(f"http://{endpoints[0]}/v1/completions", script, 1, args.seconds)
        print(f"| upstream direct | - | - | - | - | {direct['p50'] / 1e3:.2f} | +0.00 | {direct['p99'] / 1e3:.2f} | 0 |")
        config_file = work / "small-service.yaml"
        service_config = default_service_config(block_size=BLOCK)
        config_file.write_text(yaml.safe_dump(service_config))

        def row(name: str, workers: int | str, url: str, pids: Mapping[str, int]) -> None:
            run_wrk(url, script, 8, 1.0)  # warm up
            before = {n: cpu_seconds(p) for n, p in pids.items()}
            load = run_wrk(url, script, 32, args.seconds)
            cpu = {n: cpu_seconds(p) - before[n] for n, p in pids.items()}
            single = run_wrk(url, script, 1, args.seconds)
            per_1k = sum(cpu.values()) / max(1, load["requests"]) * 1e3
            envoy_1k = cpu.get("envoy", 0.0) / max(1, load["requests"]) * 1e3
            errors = load["errors"] + load["non2xx"] + single["errors"] + single["non2xx"]
            print(f"| {name} | {workers} | {load['rps']:,.0f} | {per_1k:.3f} | {envoy_1k:.3f} | {single['p50'] / 1e3:.2f} | "
                  f"{(single['p50'] - direct['p50']) / 1e3:+.2f} | {single['p99'] / 1e3:.2f} | {errors} |", flush=True)

        cells = [(variant, workers) for variant in args.variants
                 for workers in (args.workers if variant == args.variants[0] else [1])]  # fmt: skip
        for variant, workers in cells:
            grpc_port, listen, envoy_admin = free_port(), free_port(), free_port()
            service = group.spawn(f"service-{variant}-w{workers}", [
                sys.executable, "-m", "ppc_extproc", "serve", "--log-level", "warning", "--grpc-port", str(grpc_port),
                "--admin-port", "0", "--endpoints", ",".join(endpoints), "--config-file", str(config_file),
                *(["--workers", str(workers)] if workers > 1 else []),
            ])  # fmt: skip
            wait_for_grpc_health(f"127.0.0.1:{grpc_port}", "readiness", timeout=60)
            rendered = render_envoy_config(variant, work, listener_port=listen, admin_port=envoy_admin,
                                           ext_proc_port=grpc_port, file_name=f"envoy-small-{variant}-{workers}.yaml")  # fmt: skip
            proxy = group.spawn(f"envoy-{variant}-w{workers}", [envoy, "-c", str(rendered), "--disable-hot-restart", "--log-level",
                                                      "error", "--concurrency", str(workers)])  # fmt: skip
            wait_for_http(f"http://127.0.0.1:{envoy_admin}/ready")
            row(f"ppc-extproc ({variant})", workers, f"http://127.0.0.1:{listen}/v1/completions",
                {"service": service.pid or 0, "envoy": proxy.pid or 0})  # fmt: skip
            proxy.stop()
            service.stop()
        for name, stub in trivial_ext_procs():  # the floor of any Python ext_proc, on grpcio and on grpclib
            if not stub.is_file():
                continue
            grpc_port, listen, envoy_admin = free_port(), free_port(), free_port()
            service = group.spawn(stub.stem, [sys.executable, str(stub), "--grpc-port", str(grpc_port),
                                              "--admin-port", str(free_port()), "--endpoints", ",".join(endpoints)])  # fmt: skip
            wait_for_grpc_health(f"127.0.0.1:{grpc_port}", "readiness", timeout=60)
            rendered = render_envoy_config(args.variants[0], work, listener_port=listen, admin_port=envoy_admin,
                                           ext_proc_port=grpc_port, file_name=f"envoy-small-{stub.stem}.yaml")  # fmt: skip
            proxy = group.spawn(f"envoy-{stub.stem}", [envoy, "-c", str(rendered), "--disable-hot-restart",
                                                        "--log-level", "error", "--concurrency", "1"])  # fmt: skip
            wait_for_http(f"http://127.0.0.1:{envoy_admin}/ready")
            label = f"{name.removesuffix(' (round robin)')} ({stub.relative_to(Path(__file__).resolve().parents[1])})"
            row(label, 1, f"http://127.0.0.1:{listen}/v1/completions",
                {"service": service.pid or 0, "envoy": proxy.pid or 0})  # fmt: skip
            proxy.stop()
            service.stop()
        for name in args.peers:
            router = PEERS[name]
            if not router.accepts_token_ids:
                text = work / "small-text.json"
                text.write_bytes(orjson.dumps({"model": MODEL, "prompt": "a" * 4000, "max_tokens": 1}))
                peer_script = work / "post-text.lua"
                peer_script.write_text(WRK_SCRIPT.format(body=text))
            else:
                peer_script = script
            with PeerDeployment(router, [f"http://{e}" for e in endpoints], log_dir=work / f"small-{name}") as peer:
                saved, script = script, peer_script
                try:
                    row(f"{name} {router.version()}{'' if router.accepts_token_ids else ' (text)'}", 1,
                        peer.url + "/v1/completions", {"router": peer.processes[0].pid or 0})  # fmt: skip
                finally:
                    script = saved
    finally:
        group.stop_all()
    print()


# --- idle ---------------------------------------------------------------------------------------


def _load_config() -> dict[str, Any]:
    config = dict(policy("precise+load", block_size=BLOCK).service_config or {})
    return config


def part_idle(args: argparse.Namespace, work: Path) -> None:
    print(f"## Idle CPU of the service against N (mock engines in one process; {args.idle_seconds:g} s after warm-up)\n")
    print("| endpoints | configuration | service cores idle | % of a core | per endpoint µs/s | RSS MB | /metrics polls/s |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    configs: dict[str, Callable[[], dict[str, Any]]] = {
        "default (in-flight load, no polling)": lambda: default_service_config(block_size=BLOCK),
        "precise+load (/metrics polled)": _load_config,
    }
    for n in args.endpoints:
        for label, make in configs.items():
            with LocalCluster(num_engines=n, engines_per_process=n, model=MODEL, block_size=BLOCK, num_blocks=256,
                              engine_args=ENGINE_ARGS, service_config=make(), with_envoy=False,
                              service_args=["--log-level", "warning"], startup_timeout=180,
                              log_dir=work / f"idle-{n}-{label.split()[0]}", keep_logs=True) as cluster:  # fmt: skip
                assert cluster.service_process is not None
                pid = cluster.service_process.pid or 0
                time.sleep(3.0)
                polls0 = _metrics_requests(cluster)
                before, t0 = cpu_seconds(pid), time.perf_counter()
                time.sleep(args.idle_seconds)
                cores = (cpu_seconds(pid) - before) / (time.perf_counter() - t0)
                polls = (_metrics_requests(cluster) - polls0) / (time.perf_counter() - t0)
                print(f"| {n} | {label} | {cores:.4f} | {cores * 100:.2f} % | {cores / n * 1e6:,.0f} | "
                      f"{rss_bytes(pid) / 2**20:.0f} | {polls:,.1f} |", flush=True)
    print()


def _metrics_requests(cluster: LocalCluster) -> int:
    total = 0
    for url in cluster.engine_urls:
        try:
            with urllib.request.urlopen(url + "/mock/state", timeout=5) as response:
                total += int(json.loads(response.read()).get("metrics_requests", 0))
        except OSError:
            pass
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", default="streamed,chat,small,idle")
    parser.add_argument("--variants", default="buffered,full-duplex", help="Envoy configs for the streamed part")
    parser.add_argument("--peers", default="vllm-router,sglang-router", help="'' for none")
    parser.add_argument("--workers", default="1,2", help="service workers in the small part")
    parser.add_argument("--endpoints", default="16,100,256", help="N in the idle part")
    parser.add_argument("--seconds", type=float, default=8.0, help="wrk seconds per cell")
    parser.add_argument("--idle-seconds", type=float, default=20.0)
    parser.add_argument("--quick", action="store_true", help="skip the 8K workload")
    parser.add_argument("--engines", type=int, default=16, help="mock engines in the streamed part")
    parser.add_argument("--block-size", type=int, default=16, help="engines' and service's block size")
    parser.add_argument("--long-only", action="store_true",
                        help="streamed part: only agentic 100K/1K and chat 8K/64 (what --pace-ms 20 runs)")
    parser.add_argument("--pace-ms", type=float, default=2.0,
                        help="ms between a stream's SSE events (the engines' decode step); 20 = paced")  # fmt: skip
    parser.add_argument("--streams", type=int, default=0,
                        help="streamed part: agentic 100K/1K requests open at once (default 4, a quarter of "
                             "the 16 engines busy; 16 = one per engine), with as many rounds")  # fmt: skip
    parser.add_argument("--usage-sample-rate", type=float, default=0.01,
                        help="streamed part: the service's --usage-sample-rate (1 = every response's body is read, "
                             "the sampled path's cost; the default samples only the first, a warm-up request)")  # fmt: skip
    parser.add_argument("--trivial", action="store_true",
                        help="streamed part: also the trivial ext_procs (grpc.aio; grpclib if installed) in the service's place")
    parser.add_argument("--threads", action="store_true",
                        help="streamed part: the service's per-thread CPU (schedstat) per measured workload")
    parser.add_argument("--idle-window-s", type=float, default=3.0,
                        help="streamed part: seconds of idle CPU measured before each workload (minus idle)")
    parser.add_argument("--py-spy", default="", help="streamed part: py-spy record the service into this dir")
    parser.add_argument("--py-spy-flags", default="--gil -r 100", help="py-spy flags: rate, --gil or --idle")
    args = parser.parse_args()
    if args.streams < 0:
        parser.error(f"--streams must be 0 (the workload's own) or more, got {args.streams}")
    global BLOCK, NUM_BLOCKS
    BLOCK, NUM_BLOCKS = args.block_size, 8192 * 64 // args.block_size
    ENGINE_ARGS[ENGINE_ARGS.index("--decode-ms-per-token") + 1] = f"{args.pace_ms:g}"
    args.variants = [v for v in args.variants.split(",") if v]
    args.peers = [p for p in args.peers.split(",") if p and PEERS[p].available()]
    args.workers = [int(w) for w in args.workers.split(",") if w]
    args.endpoints = [int(n) for n in args.endpoints.split(",") if n]
    import logging

    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    header("bench_scale: router cost per request, throughput, idle CPU")
    print(f"load: {os.getloadavg()[0]:.2f} (1-min average before the run)\n")
    work = Path(tempfile.mkdtemp(prefix="ppc-bench-scale-"))
    parts = {"streamed": part_streamed, "chat": part_chat, "small": part_small, "idle": part_idle}
    try:
        for name in args.parts.split(","):
            parts[name](args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
