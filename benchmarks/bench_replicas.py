"""Three router replicas behind one Envoy, with and without a shared Valkey (``redis-syncer``),
next to one replica, on bursts of sibling requests (one new prefix, ``--siblings`` at once).

Per setup: hit rate (engine-reported cached / prompt tokens), TTFT p50/p90, failed requests, the
decision time p50 from the replicas' ``/debug/decisions``, the claim round trip's mean (the
``cross_replica`` stage), and — with the store — the per-endpoint in-flight error, two ways:

* scraped: every ``--sample-ms`` each replica's view (its own + its peers' counts, ``/metrics``)
  against the sum of every replica's own counts, the three scraped concurrently (their skew is in
  this figure);
* exact: each replica logs its own counts, its peers' counts and its decisions (with the counts
  each read: the claim script's, stamped at the script's instant, or its own + peers' view)
  stamped with ``time.monotonic()`` (``traceSize``; one clock for every process on Linux); from
  the merged logs, at every decision of every replica, what it read against the true sum at that
  instant — in the store's order (a request counts from the script that counted it) and against
  local starts (from its start in its replica) — and every 10 ms of the run ("over time", each
  replica's background view).

In the store-killed run, only while the store is up. Then the store is SIGKILLed a third into a
run and restarted at two thirds: failed requests, and the re-convergence time (restart → every
replica subscribed again and hearing from both others). ``--rounds`` repeats the setups in turn,
so before/after setups are interleaved.

    python benchmarks/bench_replicas.py                     # all setups, ~4 min on 2 cores
    python benchmarks/bench_replicas.py --groups 40 --only three-shared
    python benchmarks/bench_replicas.py --groups 40 --rounds 3 --only one --only three-shared \\
        --only three-shared-rendezvous --no-fault
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import header, percentile

from ppc_extproc_lab.localcluster import LocalCluster
from ppc_extproc_lab.localcluster.service_config import default_service_config, with_redis_syncer
from ppc_extproc_lab.valkey import ValkeyServer, start_valkey
from ppc_extproc_lab.workload.clients import CompletionsClient
from ppc_extproc_lab.workload.report import RequestRecord

MODEL = "mock-model"
BLOCK = 16
SETUPS = ("one", "three-local", "three-shared-coalesced", "three-shared-nocounts", "three-shared",
          "three-shared-rendezvous", "three-shared-noclaim")  # fmt: skip
#: Syncer parameters per shared setup ("three-shared-coalesced": the syncer before round 5,
#: "three-shared-nocounts": round 5's defaults, "three-shared": the claim reads and counts in-flight requests).
SYNCER: dict[str, dict[str, Any]] = {
    "three-shared-coalesced": {"claimPrefixes": True, "coldPlacement": "claim", "changePublish": "coalesced",
                               "claimCounts": False},
    # round 5's defaults: the claim reads no counts
    "three-shared-nocounts": {"claimPrefixes": True, "coldPlacement": "claim", "changePublish": "immediate",
                              "claimCounts": False},
    "three-shared": {"claimPrefixes": True, "coldPlacement": "claim", "changePublish": "immediate"},
    "three-shared-rendezvous": {"claimPrefixes": True, "coldPlacement": "rendezvous", "changePublish": "immediate"},
    "three-shared-noclaim": {"claimPrefixes": False},
}
TRACE_SIZE = 200_000


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--engines", type=int, default=4)
    p.add_argument("--groups", type=int, default=60, help="bursts per run")
    p.add_argument("--siblings", type=int, default=5, help="requests per burst (one prefix, sent at once)")
    p.add_argument("--prefix-tokens", type=int, default=1024)
    p.add_argument("--suffix-tokens", type=int, default=64)
    p.add_argument("--gap-ms", type=float, default=200.0, help="between bursts")
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--sample-ms", type=float, default=100.0,
                   help="scrape the replicas' /metrics this often for the scraped in-flight error (0: off)")
    p.add_argument("--only", choices=SETUPS, action="append", help="run only these setups")
    p.add_argument("--no-fault", action="store_true", help="skip the store kill/restart run")
    p.add_argument("--fault-setup", choices=tuple(SYNCER), default="three-shared",
                   help="the setup whose store is killed")
    p.add_argument("--dump", type=Path, help="write every run's replica traces and figures to this JSON file")
    p.add_argument("--rounds", type=int, default=1, help="repeat the chosen setups, in turn, this many times")
    return p.parse_args()


def engine_args() -> list[str]:
    # Prefill dominates TTFT (an uncached 1088-token prompt: ~54 ms; a cached prefix: ~3 ms).
    return ["--prefill-tokens-per-s", "20000", "--decode-ms-per-token", "2", "--max-num-seqs", "16"]


async def get_json(http: aiohttp.ClientSession, url: str) -> Any:
    async with http.get(url, timeout=aiohttp.ClientTimeout(total=5)) as resp:
        return await resp.json()


async def send(http: aiohttp.ClientSession, client: CompletionsClient, url: str, prompt: list[int], index: int,
               t0: float) -> RequestRecord:  # fmt: skip
    rec = RequestRecord(index=index, user=0, tenant=0, stage=0, turn=0, scheduled_s=0.0, prompt_tokens=len(prompt))
    now = lambda: time.perf_counter() - t0  # noqa: E731
    rec.sent_s = now()
    await client.send(http, url, prompt, rec, now)
    rec.done_s = now()
    return rec


def inflight_gauges(text: str) -> dict[str, list[int]]:
    """endpoint → [own requests, the other replicas' requests] from one ``/metrics`` page."""
    out: dict[str, list[int]] = {}
    for line in text.splitlines():
        for name, slot in (("ppc_extproc_inflight_requests{", 0), ("ppc_extproc_inflight_peer_requests{", 1)):
            if line.startswith(name):
                endpoint = line.split('endpoint="', 1)[1].split('"', 1)[0]
                out.setdefault(endpoint, [0, 0])[slot] = int(float(line.rsplit(" ", 1)[1]))
    return out


async def sample_inflight(http: aiohttp.ClientSession, admins: list[str], errors: list[int], stop: asyncio.Event,
                          every: float, down: Callable[[], bool]) -> None:  # fmt: skip
    """Per-endpoint |view − truth| samples, skipped while ``down()`` (the store killed, not back)."""
    async def scrape(url: str) -> dict[str, list[int]]:
        async with http.get(url + "/metrics", timeout=aiohttp.ClientTimeout(total=5)) as resp:
            return inflight_gauges(await resp.text())

    while not stop.is_set():
        try:
            views = await asyncio.gather(*(scrape(url) for url in admins))
        except (aiohttp.ClientError, TimeoutError):
            await asyncio.sleep(every)
            continue
        endpoints = {ep for v in views for ep in v}
        truth = {ep: sum(v.get(ep, [0, 0])[0] for v in views) for ep in endpoints}
        if not down():
            for v in views:
                for ep in endpoints:
                    own, peers = v.get(ep, [0, 0])
                    errors.append(abs(own + peers - truth[ep]))
        await asyncio.sleep(every)


class Series:
    """One replica's logged counts of one kind: the value at any instant (the last entry at or before it)."""

    def __init__(self, entries: list[tuple[float, dict[str, int]]]) -> None:
        entries.sort(key=lambda e: e[0])
        self.times = [t for t, _ in entries]
        self.values = [v for _, v in entries]

    def at(self, t: float) -> dict[str, int]:
        i = bisect.bisect_right(self.times, t)
        return self.values[i - 1] if i else {}


def exact_errors(traces: list[list[list[Any]]], start: float, end: float,
                 excluded: Callable[[float], bool]) -> tuple[list[int], list[int], list[int]]:  # fmt: skip
    """Per endpoint |a replica's view − the true sum| from the replicas' logs (``monotonic`` stamps;
    instants where ``excluded(t)`` are left out): (at every decision, against the store's order:
    a request counts from when the claim script that counted it was sent; at every decision,
    against local starts: a request counts from its start in its replica; every 10 ms over
    [start, end], each replica's background view against local starts). A decision's view is
    what it read (``decision`` entries: the claim script's reply, or own + peers)."""
    own = [Series([(t, c) for kind, t, c in trace if kind == "own"]) for trace in traces]
    peers = [Series([(t, c) for kind, t, c in trace if kind == "peers"]) for trace in traces]
    #: per replica: (script sent, logged just before the local start, endpoint)
    commits = [[(sent, t, ep) for kind, t, c in trace if kind == "commit" for ep, sent in c.items()]
               for trace in traces]  # fmt: skip
    endpoints = sorted({ep for trace in traces for kind, _, c in trace if kind != "commit" for ep in c})

    def truth_at(t: float, store_order: bool) -> dict[str, int]:
        owns = [s.at(t) for s in own]
        truth = {ep: sum(o.get(ep, 0) for o in owns) for ep in endpoints}
        if store_order:
            for replica in commits:
                for sent, started, ep in replica:
                    if sent < t < started and ep in truth:
                        truth[ep] += 1
        return truth

    at_store: list[int] = []
    at_local: list[int] = []
    for trace in traces:
        for kind, t, view in trace:
            if kind == "decision" and start <= t <= end and not excluded(t):
                for store_order, out in ((True, at_store), (False, at_local)):
                    truth = truth_at(t, store_order)
                    out += [abs(view.get(ep, 0) - truth[ep]) for ep in endpoints]
    over_time: list[int] = []
    t = start
    while t <= end:
        if not excluded(t):
            truth = truth_at(t, False)
            for r in range(len(traces)):
                mine, theirs = own[r].at(t), peers[r].at(t)
                over_time += [abs(mine.get(ep, 0) + theirs.get(ep, 0) - truth[ep]) for ep in endpoints]
        t += 0.01
    return at_store, at_local, over_time


async def watch_store(http: aiohttp.ClientSession, admins: list[str], replicas: int, out: dict[str, float],
                      stop: asyncio.Event) -> None:  # fmt: skip
    """Record when every replica is up and hears from all the others (``converged_s``)."""
    while not stop.is_set():
        try:
            syncers = await asyncio.gather(*(store_gauges(http, url) for url in admins))
        except (aiohttp.ClientError, TimeoutError):
            await asyncio.sleep(0.01)
            continue
        now = time.perf_counter()
        if "killed_s" in out and not any(up for up, _ in syncers):
            out.setdefault("all_down_s", now)
        if "restart_s" in out and all(up and peers == replicas - 1 for up, peers in syncers):
            out.setdefault("converged_s", now)
        await asyncio.sleep(0.01)


async def store_gauges(http: aiohttp.ClientSession, url: str) -> tuple[bool, int]:
    """(store up, peers heard from) of one replica's syncer, from ``/metrics``."""
    up, peers = False, 0
    async with http.get(url + "/metrics", timeout=aiohttp.ClientTimeout(total=5)) as resp:
        for line in (await resp.text()).splitlines():
            if line.startswith("ppc_extproc_cross_replica_store_up{"):
                up = float(line.rsplit(" ", 1)[1]) == 1.0
            elif line.startswith("ppc_extproc_cross_replica_peers{"):
                peers = int(float(line.rsplit(" ", 1)[1]))
    return up, peers


async def run_load(cluster: LocalCluster, args: argparse.Namespace, *, seed: int, shared: bool,
                   store: ValkeyServer | None = None, fault: bool = False) -> dict[str, Any]:  # fmt: skip
    rng = random.Random(seed)
    client = CompletionsClient("token-ids", model=MODEL, max_tokens=args.max_tokens)
    admins = cluster.service_admin_urls
    records: list[RequestRecord] = []
    errors: list[int] = []
    store_times: dict[str, float] = {}
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, trust_env=False) as http:
        for _ in range(3):  # warm-up bursts (connections, JIT-less but caches warm)
            prefix = [rng.randrange(1, 150_000) for _ in range(args.prefix_tokens)]
            await asyncio.gather(*(send(http, client, cluster.listener_url, prefix + [rng.randrange(1, 150_000)
                                        for _ in range(args.suffix_tokens)], -1, time.perf_counter())
                                   for _ in range(args.siblings)))  # fmt: skip
        before = await decision_counters(http, admins)
        stop = asyncio.Event()
        tasks = []
        if shared:
            def down() -> bool:
                return "killed_s" in store_times and "converged_s" not in store_times

            if args.sample_ms > 0:  # the scraped figure: the three /metrics pages cost the replicas CPU
                tasks.append(asyncio.create_task(sample_inflight(http, admins, errors, stop, args.sample_ms / 1e3, down)))
        if fault:
            tasks.append(asyncio.create_task(watch_store(http, admins, len(admins), store_times, stop)))
        t0 = time.perf_counter()
        pending: list[asyncio.Task[RequestRecord]] = []
        for g in range(args.groups):
            if fault and store is not None and g == args.groups // 3:
                store.kill()
                store_times["killed_s"] = time.perf_counter()
                store_times["killed_wall"] = time.time()
            if fault and store is not None and g == 2 * args.groups // 3:
                await asyncio.to_thread(store.restart)
                store_times["restart_s"] = time.perf_counter()
                store_times["restart_wall"] = time.time()
            prefix = [rng.randrange(1, 150_000) for _ in range(args.prefix_tokens)]
            for s in range(args.siblings):
                prompt = prefix + [rng.randrange(1, 150_000) for _ in range(args.suffix_tokens)]
                pending.append(asyncio.create_task(send(http, client, cluster.listener_url, prompt,
                                                        g * args.siblings + s, t0)))  # fmt: skip
            await asyncio.sleep(max(0.0, t0 + (g + 1) * args.gap_ms / 1e3 - time.perf_counter()))
        records = list(await asyncio.gather(*pending))
        t_end = time.perf_counter()  # CLOCK_MONOTONIC on Linux, as the replicas' trace stamps
        if fault:
            deadline = time.perf_counter() + 10
            while "converged_s" not in store_times and time.perf_counter() < deadline:
                await asyncio.sleep(0.05)
        stop.set()
        for task in tasks:
            await task
        traces: list[list[list[Any]]] = []
        if shared:
            for url in admins:
                plugins = (await get_json(http, url + "/debug/state"))["plugins"]
                traces.append(next(p.get("inflightTrace", []) for p in plugins.values() if p["type"] == "redis-syncer"))
        decisions = []
        for url in admins:
            decisions += [d["decisionMs"] for d in (await get_json(http, url + "/debug/decisions"))["decisions"]]
        after = await decision_counters(http, admins)
    ok = [r for r in records if r.ok]
    prompt_tokens = sum(r.prompt_tokens for r in ok)
    cached = sum(r.cached_tokens or 0 for r in ok)
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    stage_n = after["n"] - before["n"]
    out: dict[str, Any] = {
        "requests": len(records), "failed": len(records) - len(ok),
        "hit_rate": cached / prompt_tokens if prompt_tokens else 0.0,
        "ttft_p50_ms": statistics.median(ttfts) * 1e3, "ttft_p90_ms": percentile(ttfts, 90) * 1e3,
        "decision_p50_ms": statistics.median(decisions), "decision_p90_ms": percentile(decisions, 90),
        "claim_mean_ms": (after["s"] - before["s"]) / stage_n * 1e3 if stage_n else None,
        "claim_p50_le_ms": (q * 1e3 if (q := bucket_quantile(before["buckets"], after["buckets"], 0.5)) else None),
        "claim_p90_le_ms": (q * 1e3 if (q := bucket_quantile(before["buckets"], after["buckets"], 0.9)) else None),
        "claims": after["claims"],
        "replica_cpu_ms_per_request": (after["cpu_s"] - before["cpu_s"]) / max(1, len(records)) * 1e3,
        "traces": traces,
        "inflight_error": errors,
        **dict(zip(("exact_at_decisions", "exact_at_decisions_local", "exact_over_time"), exact_errors(
            traces, t0, t_end, lambda t: "killed_s" in store_times and t >= store_times["killed_s"]
            and ("converged_s" not in store_times or t < store_times["converged_s"])) if traces else ([], [], []))),
        "errors": sorted({r.error or "" for r in records if not r.ok})[:3],
    }  # fmt: skip
    if fault:
        wall = store_times.pop("restart_wall", None)
        killed = store_times.pop("killed_wall", None)
        out["store"] = {k: v - t0 for k, v in store_times.items()}
        if "converged_s" in store_times:
            out["reconverge_s"] = store_times["converged_s"] - store_times["restart_s"]
        if wall is not None:
            out["reconverge_logged_s"] = logged_convergence(cluster, wall, len(admins) - 1)
        if killed is not None:
            out["down_logged_s"] = logged_event(cluster, "cross_replica_store_down", killed)
    return out


def logged_event(cluster: LocalCluster, name: str, since: float) -> float | None:
    """Seconds from ``since`` (wall clock) until the last replica logged ``name``."""
    import datetime
    import json

    latest = None
    for path in sorted(cluster.log_dir.glob("service-*.log")):
        for line in path.read_text(errors="replace").splitlines():
            if name in line and line.startswith("{"):
                event = json.loads(line)
                when = datetime.datetime.fromisoformat(event["timestamp"].replace("Z", "+00:00")).timestamp()
                if when >= since:
                    latest = when if latest is None else max(latest, when)
                    break
        else:
            return None
    return None if latest is None else latest - since


def logged_convergence(cluster: LocalCluster, since: float, peers: int) -> float | None:
    """Seconds from ``since`` (wall clock) until the last replica logged hearing all ``peers``
    (``cross_replica_peer_seen``): precise where the watcher's scrapes lag on a loaded machine."""
    import datetime
    import json

    latest = None
    for path in sorted(cluster.log_dir.glob("service-*.log")):
        first = None
        for line in path.read_text(errors="replace").splitlines():
            if "cross_replica_peer_seen" not in line or not line.startswith("{"):
                continue
            event = json.loads(line)
            when = datetime.datetime.fromisoformat(event["timestamp"].replace("Z", "+00:00")).timestamp()
            if when >= since and event.get("peers") == peers:
                first = when
                break
        if first is None:
            return None
        latest = first if latest is None else max(latest, first)
    return None if latest is None else latest - since


async def decision_counters(http: aiohttp.ClientSession, admins: list[str]) -> dict[str, Any]:
    """The ``cross_replica`` stage's histogram sum and count, and the claim outcomes, over replicas."""
    total_s, total_n, cpu_s = 0.0, 0.0, 0.0
    claims: dict[str, int] = {}
    buckets: dict[float, float] = {}
    for url in admins:
        async with http.get(url + "/metrics") as resp:
            text = await resp.text()
        for line in text.splitlines():
            if line.startswith('ppc_extproc_decision_stage_duration_seconds_sum{stage="cross_replica"}'):
                total_s += float(line.rsplit(" ", 1)[1])
            elif line.startswith('ppc_extproc_decision_stage_duration_seconds_count{stage="cross_replica"}'):
                total_n += float(line.rsplit(" ", 1)[1])
            elif line.startswith("ppc_extproc_decision_stage_duration_seconds_bucket{") and '"cross_replica"' in line:
                le = line.split('le="', 1)[1].split('"', 1)[0]
                bound = float("inf") if le == "+Inf" else float(le)
                buckets[bound] = buckets.get(bound, 0.0) + float(line.rsplit(" ", 1)[1])
            elif line.startswith("process_cpu_seconds_total "):
                cpu_s += float(line.rsplit(" ", 1)[1])
            elif line.startswith("ppc_extproc_cross_replica_claims_total{"):
                outcome = line.split('outcome="', 1)[1].split('"', 1)[0]
                claims[outcome] = claims.get(outcome, 0) + int(float(line.rsplit(" ", 1)[1]))
    return {"s": total_s, "n": total_n, "claims": claims, "buckets": buckets, "cpu_s": cpu_s}


def bucket_quantile(before: dict[float, float], after: dict[float, float], q: float) -> float | None:
    """The upper bound (seconds) of the histogram bucket holding quantile ``q`` of the run."""
    counts = sorted((le, after[le] - before.get(le, 0.0)) for le in after)
    if not counts or counts[-1][1] <= 0:
        return None
    for le, n in counts:
        if n >= q * counts[-1][1]:
            return le
    return None


def cluster_for(args: argparse.Namespace, replicas: int, store: ValkeyServer | None,
                setup: str = "three-shared") -> LocalCluster:  # fmt: skip
    config = default_service_config(block_size=BLOCK)
    if store is not None:
        config = with_redis_syncer(config, store.url, traceSize=TRACE_SIZE, **SYNCER[setup])
    return LocalCluster(num_engines=args.engines, engines_per_process=args.engines, service_replicas=replicas,
                        model=MODEL, block_size=BLOCK, num_blocks=16384, engine_args=engine_args(),
                        service_config=config)  # fmt: skip


def error_text(samples: Sequence[int]) -> str:
    err = [float(e) for e in samples]
    if not err:
        return "-"
    return (f"p50 {statistics.median(err):.0f} p95 {percentile(err, 95):.0f} p99 {percentile(err, 99):.0f} "
            f"max {max(err)}, > 1 in {sum(e > 1 for e in err) / len(err):.1%} of {len(err)}")  # fmt: skip


def show(name: str, r: dict[str, Any]) -> None:
    err_text = f"in-flight error (scraped) {error_text(r['inflight_error'])}"
    claim = f"{r['claim_mean_ms']:.3f}" if r["claim_mean_ms"] is not None else "-"
    if r.get("claim_p50_le_ms"):
        claim += f" (p50 ≤ {r['claim_p50_le_ms']:g}, p90 ≤ {r['claim_p90_le_ms']:g})"
    print(f"{name:22s} {r['requests']:4d} req  failed {r['failed']:3d}  hit {r['hit_rate'] * 100:5.1f} %  "
          f"TTFT p50 {r['ttft_p50_ms']:6.1f} p90 {r['ttft_p90_ms']:6.1f} ms  decision p50 {r['decision_p50_ms']:.3f} "
          f"p90 {r['decision_p90_ms']:.3f} ms  claim mean {claim} ms  replicas' CPU "
          f"{r['replica_cpu_ms_per_request']:.2f} ms/req  {err_text}")  # fmt: skip
    if r.get("exact_at_decisions"):
        print(f"{'':22s} in-flight error (exact) at decisions, store order {error_text(r['exact_at_decisions'])}; "
              f"local starts {error_text(r['exact_at_decisions_local'])}; over time {error_text(r['exact_over_time'])}")
    if r["claims"]:
        print(f"{'':22s} claims {r['claims']}")
    if r["errors"]:
        print(f"{'':22s} errors {r['errors']}")
    if "store" in r:
        print(f"{'':22s} store {({k: round(v, 3) for k, v in r['store'].items()})}  "
              f"re-converged {r.get('reconverge_s', float('nan')) * 1e3:.0f} ms after the restart (watcher), "
              f"{(r.get('reconverge_logged_s') or float('nan')) * 1e3:.0f} ms (replicas' logs); every replica "
              f"local {(r.get('down_logged_s') or float('nan')) * 1e3:.0f} ms after the kill (logs)")


async def main() -> None:
    args = parse_args()
    header("bench_replicas: three replicas behind one Envoy sharing state through Valkey (redis-syncer)")
    print(f"{args.engines} mock engines (one process), block {BLOCK}; {args.groups} bursts of {args.siblings} siblings "
          f"({args.prefix_tokens}-token shared prefix + {args.suffix_tokens} own tokens), one burst every "
          f"{args.gap_ms:g} ms; max_tokens {args.max_tokens}; {' '.join(engine_args())}\n")  # fmt: skip
    chosen = args.only or list(SETUPS)
    runs: dict[str, list[dict[str, Any]]] = {}
    for round_ in range(args.rounds):
        for i, name in enumerate(SETUPS):
            if name not in chosen:
                continue
            seed = i + 10 * round_
            if name in SYNCER:
                with start_valkey() as store, cluster_for(args, 3, store, name) as cluster:
                    result = await run_load(cluster, args, seed=seed, shared=True)
            else:
                with cluster_for(args, 1 if name == "one" else 3, None) as cluster:
                    result = await run_load(cluster, args, seed=seed, shared=False)
            runs.setdefault(name, []).append(result)
            show(f"{name} r{round_ + 1}" if args.rounds > 1 else name, result)
        one = runs.get("one", [None])[-1]
        local = runs.get("three-local", [None])[-1]
        for name in SYNCER:
            shared = runs.get(name, [None])[-1] if len(runs.get(name, [])) == round_ + 1 else None
            if one and shared:
                print(f"{name} vs one: hit {(shared['hit_rate'] - one['hit_rate']) * 100:+.1f} points, "
                      f"TTFT p90 {shared['ttft_p90_ms'] / one['ttft_p90_ms'] - 1:+.1%}, decision p50 "
                      f"{shared['decision_p50_ms'] - one['decision_p50_ms']:+.3f} ms")  # fmt: skip
            if local and shared:
                print(f"{name} vs three-local: decision p50 {shared['decision_p50_ms'] - local['decision_p50_ms']:+.3f} ms")
    if not args.no_fault and args.fault_setup in chosen:
        with start_valkey() as store, cluster_for(args, 3, store, args.fault_setup) as cluster:
            fault = await run_load(cluster, args, seed=9, shared=True, store=store, fault=True)
        show(f"{args.fault_setup}, store killed", fault)
        runs["fault"] = [fault]
    if args.dump:
        import json

        args.dump.write_text(json.dumps(runs))


if __name__ == "__main__":
    asyncio.run(main())
