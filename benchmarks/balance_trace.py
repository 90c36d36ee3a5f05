"""Where each tenant's requests went, and the router's in-flight counts next to the engines'.

Runs ``routing_quality.py``'s scenario (a) (same flags: ``--policies``, ``--seed``, ``--form`` …)
and, while each policy runs, samples every ~20 ms the service's in-flight requests per endpoint
(``/debug/state``) and each engine's ``vllm:num_requests_running + waiting`` (``/metrics``). Prints
per policy the requests per endpoint of every tenant, where each tenant's first request went
(with the in-flight counts at that moment) and router − engine in flight over the samples, with
the release lag it implies. Writes the samples and the records to ``--trace-out`` (JSON).

    python benchmarks/balance_trace.py --policies precise+active,default --seed 2

It wraps the experiment's run coroutine (``experiment._run_with_restart``) to run the sampler
beside it: a diagnostic, not a benchmark of record (BENCHMARKS §12, round 5).
"""

from __future__ import annotations

import asyncio
import bisect
import json
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
import routing_quality as rq

from ppc_extproc_lab.localcluster import LocalCluster
from ppc_extproc_lab.workload import experiment
from ppc_extproc_lab.workload.experiment import PolicyRun

_SAMPLES: list[dict[str, Any]] = []
_RUNS: list[tuple[PolicyRun, list[dict[str, Any]]]] = []
_run_with_restart = experiment._run_with_restart
_run_policy = rq.run_policy


async def _engine_load(http: aiohttp.ClientSession, url: str) -> float:
    async with http.get(url + "/metrics") as resp:
        text = await resp.text()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(("vllm:num_requests_running", "vllm:num_requests_waiting")))  # fmt: skip


async def _sample(cluster: LocalCluster, stop: asyncio.Event, t0: float) -> None:
    admin = cluster.service_admin_urls[0] if cluster.service_admin_urls else None
    engines = list(zip(cluster.engine_endpoints, cluster.engine_urls))
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as http:
        while not stop.is_set():
            row: dict[str, Any] = {"t": time.monotonic() - t0, "router": {}, "engine": {}}
            try:
                if admin is not None:
                    async with http.get(admin + "/debug/state") as resp:
                        state = await resp.json()
                    row["router"] = {ep: v["requests"] for ep, v in state["inflight"].items()}
                loads = await asyncio.gather(*(_engine_load(http, url) for _, url in engines))
                row["engine"] = {ep: n for (ep, _), n in zip(engines, loads)}
                _SAMPLES.append(row)
            except (aiohttp.ClientError, TimeoutError, ValueError, KeyError):
                pass
            await asyncio.sleep(0.02)


async def _with_sampler(runner: Any, cluster: LocalCluster, *args: Any) -> Any:
    stop = asyncio.Event()
    task = asyncio.create_task(_sample(cluster, stop, time.monotonic()))
    try:
        return await _run_with_restart(runner, cluster, *args)
    finally:
        stop.set()
        await task


def _recording_run_policy(*args: Any, **kwargs: Any) -> PolicyRun:
    _SAMPLES.clear()
    run = _run_policy(*args, **kwargs)
    _RUNS.append((run, list(_SAMPLES)))
    return run


def _report(run: PolicyRun, samples: list[dict[str, Any]]) -> dict[str, Any]:
    eps = run.endpoints
    done = [r for r in run.result.records if r.ok and not r.direct]
    placement: dict[int, Counter[str]] = defaultdict(Counter)
    for r in done:
        placement[r.tenant][r.endpoint or ""] += 1
    print(f"== {run.policy.name}: requests per endpoint of each tenant (whole run), endpoints {eps}")
    for tenant in sorted(placement):
        print(f"  tenant {tenant}: {[placement[tenant][e] for e in eps]}")
    times = [s["t"] for s in samples]
    first: set[int] = set()
    print("  first request of each tenant: time, endpoint index, in flight (router | engines)")
    for r in sorted(done, key=lambda r: r.sent_s or 0.0):
        if r.tenant in first or r.sent_s is None or r.endpoint is None:
            continue
        first.add(r.tenant)
        s = samples[max(0, bisect.bisect(times, r.sent_s) - 1)] if samples else {"router": {}, "engine": {}}
        print(f"    {r.sent_s:5.2f} s  tenant {r.tenant} → {eps.index(r.endpoint)}  "
              f"{[s['router'].get(e, 0) for e in eps]} | {[s['engine'].get(e, 0) for e in eps]}")  # fmt: skip
    diffs = sorted(s["router"].get(e, 0) - s["engine"].get(e, 0) for s in samples for e in eps)
    if diffs and done:
        n = len(diffs)
        span = max(r.done_s or 0.0 for r in done) - min(r.sent_s or 0.0 for r in done)
        per_endpoint_rate = len(done) / span / len(eps)
        mean = sum(diffs) / n
        print(f"  router − engine in flight over {len(samples)} samples × {len(eps)} endpoints: mean {mean:+.3f}, "
              f"p5 {diffs[n // 20]:+.0f}, p50 {diffs[n // 2]:+.0f}, p95 {diffs[19 * n // 20]:+.0f}; "
              f"implied release lag {1000 * mean / per_endpoint_rate:.0f} ms")  # fmt: skip
    return {
        "policy": run.policy.name,
        "endpoints": eps,
        "samples": samples,
        "records": [{"tenant": r.tenant, "user": r.user, "endpoint": r.endpoint, "sent_s": r.sent_s,
                     "first_token_s": r.first_token_s, "done_s": r.done_s} for r in done],
    }


def main() -> int:
    trace_out = Path("benchmarks/out/balance_trace.json")
    if "--trace-out" in sys.argv:
        i = sys.argv.index("--trace-out")
        trace_out = Path(sys.argv[i + 1])
        del sys.argv[i : i + 2]
    sys.argv[1:1] = ["--scenarios", "single", "--charts-dir", ""]
    args = rq.parse_args()
    experiment._run_with_restart = _with_sampler  # type: ignore[assignment]
    rq.run_policy = _recording_run_policy  # type: ignore[assignment]
    rq.configure_logging("console", "error")
    with tempfile.TemporaryDirectory(prefix="balance-trace-") as scratch:
        code = rq.run(args, rq.engine_tokens(args, Path(scratch)))
    trace_out.parent.mkdir(parents=True, exist_ok=True)
    trace_out.write_text(json.dumps([_report(run, samples) for run, samples in _RUNS]), encoding="utf-8")
    print(f"wrote {trace_out}")
    return code


if __name__ == "__main__":
    sys.exit(main())
