"""One policy, one cold cluster, one run of the shared schedule: the unit the demo and the
routing benchmark repeat per policy.

``run_policy`` starts a :class:`~ppc_extproc_lab.localcluster.LocalCluster` (fresh engines ⇒ cold
caches) and the policy's router in front of it, ``plan.service_replicas`` replicas of it:

* ours: the service with the policy's config behind Envoy (Envoy balances the ext_proc streams);
* a peer router (:mod:`~ppc_extproc_lab.workload.peers`): its processes, with an Envoy round-robin
  balancer in front of several;
* the oracle: nothing — the client picks the engine.

It sends the schedule through the router in the request form of ``client``, optionally restarts
an engine mid-run (:class:`~ppc_extproc_lab.workload.disturbance.EngineRestart`) and sends a share of
the arrivals around the router (:class:`~ppc_extproc_lab.workload.disturbance.OutsideTraffic`),
measures CPU and the services' decision latency, and always stops every process — also on Ctrl-C.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import structlog

from ppc_extproc_lab.localcluster import LocalCluster
from ppc_extproc_lab.workload.clients import RequestClient
from ppc_extproc_lab.workload.disturbance import EngineRestart, OutsideTraffic, RestartRecord, run_restart
from ppc_extproc_lab.workload.generator import Arrival
from ppc_extproc_lab.workload.oracle import OracleTarget
from ppc_extproc_lab.workload.peers import KvEventSources, PeerDeployment
from ppc_extproc_lab.workload.policies import Policy
from ppc_extproc_lab.workload.probes import CpuMeter, CpuReport, DecisionLatency, decision_latency
from ppc_extproc_lab.workload.report import RequestRecord, Summary, summarize
from ppc_extproc_lab.workload.runner import Conversations, Progress, RunResult, Target, WorkloadRunner
from ppc_extproc_lab.workload.spec import EngineProfile, Stage

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
    #: Router replicas (our service behind Envoy, or a peer router behind a balancer); each sees
    #: only the requests it is given.
    service_replicas: int = 1
    startup_timeout_s: float = 60.0
    keep_logs: bool = False
    #: HF tokenizer directory: the engines tokenise text and chat with it (``--tokenizer``) and our
    #: service gets a local ``token-producer`` on it. None: strings are their UTF-8 bytes.
    tokenizer: str | None = None
    #: Of ``engines``, how many are prefill engines for a P/D policy (the rest are decode pods);
    #: 0: half of them.
    prefill_engines: int = 0

    @property
    def pd_roles(self) -> list[str]:
        """The engines' roles under a P/D policy: prefill engines first, then decode pods."""
        prefill = self.prefill_engines or max(1, self.engines // 2)
        if not 0 < prefill < self.engines:
            raise ValueError(f"a P/D cluster needs 1..{self.engines - 1} prefill engines, got {prefill}")
        return ["prefill"] * prefill + ["decode"] * (self.engines - prefill)


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
    #: The requests sent around the router (outside traffic), if any.
    outside: Summary | None = None
    #: Request form the router was sent (``clients.FORMS``).
    form: str = ""
    #: Names in ``cpu.cores_by_process`` of the router's processes (Envoy, services, peers).
    router_processes: tuple[str, ...] = ()

    @property
    def router_cpu_s(self) -> float:
        """CPU seconds the router's processes used during the run (NaN without a router)."""
        if self.cpu is None or not self.router_processes:
            return math.nan
        cores = self.cpu.cores_by_process
        return sum(cores.get(n, 0.0) for n in self.router_processes) * self.cpu.wall_s

    @property
    def router_cpu_s_per_1k(self) -> float:
        """Router CPU seconds per 1,000 completed routed requests."""
        routed = self.summary.completed
        return 1000 * self.router_cpu_s / routed if routed else math.nan


def stage_summaries(name: str, result: RunResult, stages: Sequence[Stage], endpoints: Sequence[str]) -> list[Summary]:
    """One summary per stage (routed requests by scheduled arrival), window from the stage's start."""
    out: list[Summary] = []
    start = 0.0
    for i, stage in enumerate(stages):
        end = start + stage.duration_s
        recs = [r for r in result.records if r.stage == i and not r.direct]
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
    body = {"model": model, "prompt": "ping", "max_tokens": 1}  # text: every router takes it
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
    runner: WorkloadRunner,
    cluster: LocalCluster,
    workload: Conversations,
    restart: EngineRestart | None,
    context_match: Callable[[int], Mapping[str, Any]] | None = None,
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
                    restart_process=restart_process, context_match=context_match)
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


@contextlib.contextmanager
def _router(chosen: Policy, cluster: LocalCluster, plan: ClusterPlan) -> Iterator[tuple[str | None, dict[str, int]]]:
    """The router's URL (None for the oracle) and its processes' pids, while it runs."""
    if chosen.peer is not None:
        kv = KvEventSources(cluster.kv_events_endpoints, [f"tcp://{ip}:{cluster.replay_port}" for ip in cluster.engine_ips],
                            plan.profile.block_size, plan.model)  # fmt: skip
        with PeerDeployment(chosen.peer, cluster.engine_urls, log_dir=cluster.log_dir / "peers", kv=kv,
                            replicas=plan.service_replicas, startup_timeout=plan.startup_timeout_s) as dep:  # fmt: skip
            yield dep.url, {p.name: p.pid for p in dep.processes if p.pid is not None}
        return
    pids = {p.name: p.pid for p in cluster.service_processes if p.pid is not None}
    if cluster.envoy_process is not None and cluster.envoy_process.pid is not None:
        pids["envoy"] = cluster.envoy_process.pid
    yield (None if chosen.oracle else cluster.listener_url), pids


def run_policy(
    chosen: Policy,
    workload: Conversations,
    schedule: Sequence[Arrival],
    stages: Sequence[Stage],
    plan: ClusterPlan,
    *,
    drain_s: float = 30.0,
    request_timeout_s: float = 120.0,
    on_progress: Callable[[Progress], None] | None = None,
    restart: EngineRestart | None = None,
    client: RequestClient | None = None,
    outside: OutsideTraffic | None = None,
    warmup_s: float = 0.0,
) -> PolicyRun:
    """Run ``schedule`` under ``chosen`` on a fresh cluster; every process is always stopped.

    ``client`` sends the requests (default: token ids, which needs the token ``Workload``). The
    whole-run summary counts the arrivals from ``warmup_s`` on (the cold start before is sent
    but not counted; per-stage summaries count everything)."""
    schedule_s = sum(s.duration_s for s in stages)
    prof = plan.profile
    prof.check_fits(workload.spec)
    cluster = LocalCluster(
        num_engines=plan.engines,
        model=plan.model,
        block_size=prof.block_size,
        num_blocks=prof.num_blocks,
        engine_args=prof.engine_args(),
        service_config=chosen.service_config,
        service_replicas=plan.service_replicas if chosen.ours else 1,
        with_service=chosen.ours,
        envoy_args=["--concurrency", str(plan.envoy_concurrency)],
        startup_timeout=plan.startup_timeout_s,
        keep_logs=plan.keep_logs,
        tokenizer=plan.tokenizer,
        roles=plan.pd_roles if chosen.pd else None,
    )
    with cluster, _router(chosen, cluster, plan) as (router_url, router_pids):
        # Under P/D the decode pods answer (and count in the balance); prefill engines never do.
        endpoints = [e for i, e in enumerate(cluster.engine_endpoints) if cluster.role(i) != "prefill"]
        target: Target | str
        if router_url is None:
            target = OracleTarget(cluster.engine_urls, seed=workload.spec.seed)
        else:
            target = router_url
            asyncio.run(_probe(router_url, plan.model))
        bypass = outside.plan(schedule, cluster.engine_urls, workload.spec.seed) if outside else None
        runner = WorkloadRunner(
            workload, schedule, target, schedule_s=schedule_s, model=plan.model,
            request_timeout_s=request_timeout_s, deadline_s=schedule_s + drain_s, on_progress=on_progress,
            client=client, bypass=bypass,
        )  # fmt: skip
        meter = CpuMeter()
        pids: dict[str, int | None] = {p.name: p.pid for p in cluster.engine_processes}
        pids.update({p.name: p.pid for p in cluster.sidecar_processes.values()})
        pids.update(router_pids)
        meter.start(pids)
        def match(tenant: int) -> Mapping[str, Any]:
            return runner.client.match_body(workload.context_prompt(tenant))

        result, restarted = asyncio.run(_run_with_restart(runner, cluster, workload, restart, match))
        cpu = meter.stop()
        decisions = decision_latency(cluster.service_admin_urls) if chosen.ours else None
        states = asyncio.run(_engine_states(cluster.mock_urls))
    measured = [r for r in result.records if r.scheduled_s >= warmup_s]
    routed = [r for r in measured if not r.direct]
    summary = summarize(chosen.name, routed, endpoints=endpoints, start_s=warmup_s, end_s=schedule_s)
    run = PolicyRun(
        chosen, result, summary, stage_summaries(chosen.name, result, stages, endpoints),
        endpoints, cpu, decisions, states, 0 if chosen.oracle else plan.service_replicas, restarted,
        outside=_outside_summary(chosen.name, measured, endpoints, warmup_s, schedule_s) if bypass else None,
        form=runner.client.form, router_processes=tuple(router_pids),
    )  # fmt: skip
    log.info(
        "policy_run_finished",
        policy=chosen.name,
        hit_rate=None if math.isnan(summary.hit_rate) else round(summary.hit_rate, 4),
        completed=summary.completed,
        errors=summary.errors,
    )
    return run


def _outside_summary(
    name: str, records: Sequence[RequestRecord], endpoints: Sequence[str], start_s: float, end_s: float
) -> Summary:
    direct = [r for r in records if r.direct]
    return summarize(f"{name} (outside)", direct, endpoints=endpoints, start_s=start_s, end_s=end_s)
