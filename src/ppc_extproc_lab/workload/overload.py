"""The overload experiment: a pool of mock engines driven past its capacity by tenants in two bands,
with the router's flow control off, on, or dispatching by llm-d's rule.

One run (``run_overload``) on a fresh :class:`~ppc_extproc_lab.localcluster.LocalCluster`:

1. **unloaded** — the priority-0 tenant alone: its TTFT is the reference;
2. **loaded** — every tenant at once (the plan's ``load`` × the pool's capacity); every engine
   logs its real waiting queue at each ``/metrics`` scrape;
3. **stalled** — the same load with every engine's ``/metrics`` stalled (it stops answering).

Capacity is the decode-bound request rate: ``engines × max_num_seqs / (max_tokens × decode step +
prefill)``. Modes:

* ``off``: no flow control (the legacy rule still sheds priority < 0 at saturation ≥ 1);
* ``on``: ``featureGates: [flowControl]``, ``utilization-detector`` with ppc-extproc's stale rule
  (in-flight accounting), in-flight credit on, also the profile's filter (as in llm-d),
  ``program-aware-fairness`` charged in uncached prompt tokens in both bands;
* ``llmd``: the same but dispatching as llm-d does: in-flight credit off, a stale endpoint
  counts as saturated;
* ``holdback`` (not in the default set): ``on`` with ``concurrency-detector`` (``maxConcurrency``
  = ``max_num_seqs``: saturation is the pool's busy sequence slots, as this service counts them,
  also a filter) and ``priority-holdback-policy`` (band −1's ceiling ``holdback_ceiling``), so a
  share of the slots stays free for priority 0.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ppc_extproc_lab.localcluster import LocalCluster
from ppc_extproc_lab.workload.report import percentile
from ppc_extproc_lab.workload.tenants import Tenant, TenantRecord, jain_index, run_tenants, uncached_service

__all__ = ["ALL_MODES", "MODES", "OverloadPlan", "OverloadResult", "PhaseResult", "router_config", "run_overload"]

MODES = ("off", "on", "llmd")
ALL_MODES = (*MODES, "holdback")


@dataclass(frozen=True, slots=True)
class OverloadPlan:
    engines: int = 2
    max_num_seqs: int = 4
    decode_ms_per_token: float = 20.0
    prefill_tokens_per_s: float = 20_000.0
    #: vLLM updates its gauges once per engine step.
    metrics_update_ms: float = 20.0
    prompt_tokens: int = 256
    max_tokens: int = 50
    #: Offered load in units of the pool's capacity.
    load: float = 2.0
    #: The priority-0 tenant's share of the capacity; the rest of the load is split 3:1 between
    #: two equal-weight band −1 tenants.
    interactive_share: float = 0.2
    unloaded_s: float = 20.0
    loaded_s: float = 40.0
    stalled_s: float = 15.0
    queue_depth_threshold: int = 5
    request_ttl_s: float = 10.0
    #: ``holdback`` mode: band −1 dispatches while the busy share of the slots is below this.
    holdback_ceiling: float = 0.5
    seed: int = 0

    @property
    def capacity(self) -> float:
        """Requests per second the pool completes when every sequence slot is busy."""
        per_request = self.max_tokens * self.decode_ms_per_token / 1e3 + self.prompt_tokens / self.prefill_tokens_per_s
        return self.engines * self.max_num_seqs / per_request

    def tenants(self, loaded: bool) -> list[Tenant]:
        cap = self.capacity
        interactive = Tenant("interactive", "interactive", 0, cap * self.interactive_share,
                             self.prompt_tokens, self.max_tokens)  # fmt: skip
        if not loaded:
            return [interactive]
        rest = cap * max(0.0, self.load - self.interactive_share)
        return [
            interactive,
            Tenant("batch-a", "batch", -1, rest * 0.75, self.prompt_tokens, self.max_tokens),
            Tenant("batch-b", "batch", -1, rest * 0.25, self.prompt_tokens, self.max_tokens),
        ]


def router_config(mode: str, plan: OverloadPlan) -> dict[str, Any]:
    """The router's EndpointPickerConfig for ``mode`` (load-balancing scorers, 50 ms scrapes)."""
    if mode not in ALL_MODES:
        raise ValueError(f"mode must be one of {', '.join(ALL_MODES)}")
    plugins: list[dict[str, Any]] = [
        {"type": "metrics-data-source", "parameters": {"interval": "50ms", "maxInterval": "50ms"}},
        {"type": "core-metrics-extractor"},
        {"type": "queue-scorer"},
        {"type": "kv-cache-utilization-scorer"},
        {"type": "max-score-picker"},
    ]
    config: dict[str, Any] = {
        "apiVersion": "llm-d.ai/v1alpha1",
        "kind": "EndpointPickerConfig",
        "plugins": plugins,
        "dataLayer": {"sources": [{"pluginRef": "metrics-data-source", "extractors": [{"pluginRef": "core-metrics-extractor"}]}]},
        "schedulingProfiles": [{"name": "default", "plugins": [
            {"pluginRef": "queue-scorer", "weight": 1}, {"pluginRef": "kv-cache-utilization-scorer", "weight": 1},
            {"pluginRef": "max-score-picker"}]}],
    }  # fmt: skip
    if mode == "off":
        return config
    llmd = mode == "llmd"
    plugins.append({"type": "program-aware-fairness", "parameters": {"serviceUnit": "uncachedPromptTokens"}})
    if mode == "holdback":
        plugins += [
            {"type": "concurrency-detector", "name": "saturation",
             "parameters": {"concurrencyMode": "requests", "maxConcurrency": plan.max_num_seqs}},
            {"type": "priority-holdback-policy", "parameters": {"minCeiling": plan.holdback_ceiling}},
        ]  # fmt: skip
        config["schedulingProfiles"][0]["plugins"].insert(0, {"pluginRef": "saturation"})
    else:
        plugins.append({"type": "utilization-detector", "name": "saturation", "parameters": {
            "queueDepthThreshold": plan.queue_depth_threshold, "metricsStalenessThreshold": "200ms",
            "staleMetrics": "saturated" if llmd else "inflight"}})  # fmt: skip
        # llm-d's saturation detectors are filters too: an endpoint over its limits leaves the candidates
        config["schedulingProfiles"][0]["plugins"].insert(0, {"pluginRef": "saturation"})
    band = {"fairnessPolicyRef": "program-aware-fairness"}
    config["featureGates"] = ["flowControl"]
    config["flowControl"] = {
        "defaultRequestTTL": f"{plan.request_ttl_s:g}s",
        "saturationDetector": {"pluginRef": "saturation"},
        "defaultPriorityBand": band,
        "defaultNegativePriorityBand": band,
        "inflightCredit": not llmd,
    }
    if mode == "holdback":
        config["flowControl"]["usageLimitPolicyPluginRef"] = "priority-holdback-policy"
    return config


def objectives_yaml() -> str:
    """The InferenceObjectives the tenants name (``--crd-file``): interactive 0, batch −1."""
    docs = [{"apiVersion": "inference.networking.x-k8s.io/v1alpha2", "kind": "InferenceObjective",
             "metadata": {"name": name}, "spec": {"priority": priority}}
            for name, priority in (("interactive", 0), ("batch", -1))]  # fmt: skip
    return str(yaml.safe_dump_all(docs, sort_keys=False))


@dataclass(slots=True)
class PhaseResult:
    name: str
    records: list[TenantRecord]
    #: Per engine: [t, waiting, served waiting, running] at each scrape during the phase.
    scrapes: list[list[list[float]]] = field(default_factory=list)
    #: Monotonic time the last arrival was due (the end of contention).
    arrivals_end: float | None = None

    def p0(self) -> list[TenantRecord]:
        return [r for r in self.records if r.priority == 0]

    def ttft_p99(self, priority: int = 0) -> float | None:
        ttfts = [r.ttft for r in self.records if r.priority == priority and r.ttft is not None]
        return percentile(ttfts, 99) if ttfts else None

    def rejected(self, priority: int | None = None) -> int:
        return sum(1 for r in self.records if (priority is None or r.priority == priority) and 400 <= r.status < 500)

    def server_errors(self) -> int:
        """5xx answers and requests that got no answer at all."""
        return sum(1 for r in self.records if r.status >= 500 or (r.status == 0 and r.error is not None))

    def max_waiting(self) -> int:
        return int(max((s[1] for engine in self.scrapes for s in engine), default=0))

    def scrapes_over(self, threshold: int) -> tuple[int, int]:
        """(scrapes whose real waiting queue exceeded ``threshold``, scrapes)."""
        every = [s for engine in self.scrapes for s in engine]
        return sum(1 for s in every if s[1] > threshold), len(every)

    def service(self, band: int | None = None) -> dict[str, int]:
        """Uncached prompt tokens each tenant got prefilled while arrivals lasted."""
        return uncached_service(self.records, band, self.arrivals_end)

    def jain(self, band: int = -1) -> float:
        """Jain's index over the band's tenants' service while arrivals lasted."""
        return jain_index(self.service(band).values())


@dataclass(slots=True)
class OverloadResult:
    mode: str
    plan: OverloadPlan
    phases: dict[str, PhaseResult]


def _post(url: str, body: dict[str, Any]) -> None:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        response.read()


def _scrapes(cluster: LocalCluster, clear: bool) -> list[list[list[float]]]:
    out = []
    for url in cluster.engine_urls:
        with urllib.request.urlopen(f"{url}/mock/scrapes{'?clear=1' if clear else ''}", timeout=10) as response:
            out.append(json.loads(response.read())["scrapes"])
    return out


async def _phase(name: str, cluster: LocalCluster, tenants: Sequence[Tenant], duration_s: float, plan: OverloadPlan,
                 model: str) -> PhaseResult:  # fmt: skip
    _scrapes(cluster, clear=True)
    end = time.monotonic() + duration_s
    records = await run_tenants(cluster.listener_url, tenants, duration_s, model=model, seed=plan.seed)
    return PhaseResult(name, records, _scrapes(cluster, clear=True), end)


def run_overload(mode: str, plan: OverloadPlan, log_dir: Path | None = None, model: str = "mock-model") -> OverloadResult:
    """One mode's three phases on a fresh cluster (every process stopped on return)."""
    config = router_config(mode, plan)
    engine_args = ["--max-num-seqs", str(plan.max_num_seqs), "--decode-ms-per-token", str(plan.decode_ms_per_token),
                   "--prefill-tokens-per-s", str(plan.prefill_tokens_per_s),
                   "--metrics-update-ms", str(plan.metrics_update_ms), "--stream-interval-ms", "50"]  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="overload-") as tmp:
        crd = Path(tmp) / "objectives.yaml"
        crd.write_text(objectives_yaml())
        with LocalCluster(num_engines=plan.engines, model=model, engine_args=engine_args, service_config=config,
                          service_args=["--crd-file", str(crd)], log_dir=log_dir, keep_logs=log_dir is not None,
                          replay=False) as cluster:  # fmt: skip
            return OverloadResult(mode, plan, _phases(cluster, plan, model))


def _phases(cluster: LocalCluster, plan: OverloadPlan, model: str) -> dict[str, PhaseResult]:
    phases: dict[str, PhaseResult] = {}
    phases["unloaded"] = asyncio.run(_phase("unloaded", cluster, plan.tenants(False), plan.unloaded_s, plan, model))
    phases["loaded"] = asyncio.run(_phase("loaded", cluster, plan.tenants(True), plan.loaded_s, plan, model))
    if plan.stalled_s > 0:
        for url in cluster.engine_urls:
            _post(f"{url}/mock/metrics-stall", {"stalled": True})
        try:
            phases["stalled"] = asyncio.run(_phase("stalled", cluster, plan.tenants(True), plan.stalled_s, plan, model))
        finally:
            for url in cluster.engine_urls:
                _post(f"{url}/mock/metrics-stall", {"stalled": False})
    return phases
