"""One policy, one cold cluster, one run of the shared schedule: the unit the demo and the
routing benchmark repeat per policy.

``run_policy`` starts a :class:`~ppc_extproc.localcluster.LocalCluster` (fresh engines ⇒ cold
caches) with the policy's service config — on ``plan.service_replicas`` router replicas behind
Envoy — sends the schedule through Envoy (or, for the oracle, straight to the engines it picks),
optionally restarts an engine mid-run (:class:`~ppc_extproc.workload.disturbance.EngineRestart`),
measures CPU and the services' decision latency, and always stops the cluster — also on Ctrl-C.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import structlog

from ppc_extproc.localcluster import LocalCluster
from ppc_extproc.workload.disturbance import EngineRestart, RestartRecord, run_restart
from ppc_extproc.workload.generator import Arrival, Workload
from ppc_extproc.workload.oracle import OracleTarget
from ppc_extproc.workload.policies import Policy, policy
from ppc_extproc.workload.probes import CpuMeter, CpuReport, DecisionLatency, decision_latency
from ppc_extproc.workload.report import Summary, summarize
from ppc_extproc.workload.runner import Progress, RunResult, Target, WorkloadRunner
from ppc_extproc.workload.spec import EngineProfile, Stage

__all__ = ["ClusterPlan", "PolicyRun", "run_policy", "stage_summaries"]

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class ClusterPlan:
    """The cluster every policy gets (fresh each time)."""

    engines: int = 4
    profile: EngineProfile = field(default_factory=EngineProfile)
    model: str = "mock-model"
    #: Envoy worker threads (1 leaves the cores to the engines).
    envoy_concurrency: int = 1
    #: Router (service) replicas behind Envoy; each sees only the requests Envoy gives it.
    service_replicas: int = 1
    startup_timeout_s: float = 60.0
    keep_logs: bool = False


@dataclass(slots=True)
class PolicyRun:
    policy: Policy
    result: RunResult
    summary: Summary
    stages: list[Summary]
    endpoints: list[str]
    cpu: CpuReport | None = None
    decisions: DecisionLatency | None = None
    engine_states: list[dict[str, Any]] = field(default_factory=list)
    #: Router replicas the run had (the oracle has none in the path).
    replicas: int = 1
    #: The mid-run engine restart, if the run had one and reached it.
    restart: RestartRecord | None = None


def stage_summaries(name: str, result: RunResult, stages: Sequence[Stage], endpoints: Sequence[str]) -> list[Summary]:
    """One summary per stage (requests by scheduled arrival), window from the stage's start."""
    out: list[Summary] = []
    start = 0.0
    for i, stage in enumerate(stages):
        end = start + stage.duration_s
        recs = [r for r in result.records if r.stage == i]
        out.append(
            summarize(
                name, recs, endpoints=endpoints, start_s=start, end_s=end,
                label=f"{stage.rate_per_s:g} req/s",
            )
        )  # fmt: skip
        start = end
    return out


async def _probe(url: str, model: str) -> None:
    """One request below a block (caches nothing): connections and the ext_proc stream are up."""
    body = {"model": model, "prompt": [7, 7, 7, 7], "max_tokens": 1}
    timeout = aiohttp.ClientTimeout(total=30)
    async with (
        aiohttp.ClientSession(timeout=timeout) as http,
        http.post(url + "/v1/completions", json=body) as resp,
    ):
        await resp.read()
        if resp.status != 200:
            log.warning("probe_failed", status=resp.status)


async def _engine_states(urls: Sequence[str]) -> list[dict[str, Any]]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:

        async def one(url: str) -> dict[str, Any]:
            try:
                async with http.get(url + "/mock/state") as resp:
                    state: dict[str, Any] = await resp.json()
                    return state
            except (aiohttp.ClientError, TimeoutError, ValueError):
                return {}

        return list(await asyncio.gather(*(one(u) for u in urls)))


async def _run_with_restart(
    runner: WorkloadRunner, cluster: LocalCluster, workload: Workload, restart: EngineRestart | None
) -> tuple[RunResult, RestartRecord | None]:
    """Run the schedule; meanwhile restart an engine at ``restart.at_s`` (if the run lasts)."""
    if restart is None:
        return await runner.run(), None
    loop = asyncio.get_running_loop()
    t0 = loop.time()  # the runner's clock starts now too (it reads the time before its first await)

    async def restart_process(index: int) -> None:
        await asyncio.to_thread(cluster.restart_engine, index)

    task = asyncio.create_task(
        run_restart(restart, cluster.engine_urls, workload, now=lambda: loop.time() - t0,
                    restart_process=restart_process)
    )  # fmt: skip
    try:
        result = await runner.run()
    finally:
        # Cancel a restart that has not begun; let one under way finish, so a process restart
        # never races the cluster's stop (a process started after it would outlive the run).
        if not task.done() and loop.time() - t0 < restart.at_s:
            task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    record = task.result() if task.done() and not task.cancelled() else None
    return result, record


def run_policy(
    chosen: Policy,
    workload: Workload,
    schedule: Sequence[Arrival],
    stages: Sequence[Stage],
    plan: ClusterPlan,
    *,
    drain_s: float = 30.0,
    request_timeout_s: float = 120.0,
    on_progress: Callable[[Progress], None] | None = None,
    restart: EngineRestart | None = None,
) -> PolicyRun:
    """Run ``schedule`` under ``chosen`` on a fresh cluster; the cluster is always stopped."""
    schedule_s = sum(s.duration_s for s in stages)
    prof = plan.profile
    prof.check_fits(workload.spec)
    # The oracle bypasses the service; it still runs (with a trivial config) so the cluster is
    # the same set of processes minus Envoy.
    config = chosen.service_config or policy("random").service_config
    cluster = LocalCluster(
        num_engines=plan.engines,
        model=plan.model,
        block_size=prof.block_size,
        num_blocks=prof.num_blocks,
        engine_args=prof.engine_args(),
        service_config=config,
        service_replicas=1 if chosen.oracle else plan.service_replicas,
        with_envoy=not chosen.oracle,
        envoy_args=["--concurrency", str(plan.envoy_concurrency)],
        startup_timeout=plan.startup_timeout_s,
        keep_logs=plan.keep_logs,
    )
    with cluster:
        endpoints = cluster.engine_endpoints
        target: Target | str
        if chosen.oracle:
            target = OracleTarget(cluster.engine_urls, seed=workload.spec.seed)
        else:
            target = cluster.listener_url
            asyncio.run(_probe(cluster.listener_url, plan.model))
        runner = WorkloadRunner(
            workload,
            schedule,
            target,
            schedule_s=schedule_s,
            model=plan.model,
            request_timeout_s=request_timeout_s,
            deadline_s=schedule_s + drain_s,
            on_progress=on_progress,
        )
        meter = CpuMeter()
        pids: dict[str, int | None] = {p.name: p.pid for p in cluster.engine_processes}
        pids.update({p.name: p.pid for p in cluster.service_processes})
        if cluster.envoy_process is not None:
            pids["envoy"] = cluster.envoy_process.pid
        meter.start(pids)
        result, restarted = asyncio.run(_run_with_restart(runner, cluster, workload, restart))
        cpu = meter.stop()
        decisions = None if chosen.oracle else decision_latency(cluster.service_admin_urls)
        states = asyncio.run(_engine_states(cluster.engine_urls))
    summary = summarize(chosen.name, result.records, endpoints=endpoints, end_s=schedule_s)
    run = PolicyRun(
        chosen, result, summary, stage_summaries(chosen.name, result, stages, endpoints),
        endpoints, cpu, decisions, states, 0 if chosen.oracle else cluster.service_replicas, restarted,
    )  # fmt: skip
    log.info(
        "policy_run_finished",
        policy=chosen.name,
        hit_rate=None if math.isnan(summary.hit_rate) else round(summary.hit_rate, 4),
        completed=summary.completed,
        errors=summary.errors,
    )
    return run
