"""The shared-prefix, multi-turn workload: generator, runner, report — for the demo and benchmarks.

Importing this package starts nothing and imports its modules on first use.

* :mod:`~ppc_extproc_lab.workload.spec` — ``WorkloadSpec``, arrival ``Stage``s, ``EngineProfile``;
* :mod:`~ppc_extproc_lab.workload.generator` — seeded token ids, Poisson ``arrivals``, conversations;
* :mod:`~ppc_extproc_lab.workload.text` — the same workload as text (string, chat or token-id forms);
* :mod:`~ppc_extproc_lab.workload.clients` — the request forms on the wire (aiohttp, ``openai``);
* :mod:`~ppc_extproc_lab.workload.runner` — ``WorkloadRunner``: streaming, per-request records;
* :mod:`~ppc_extproc_lab.workload.report` / :mod:`~ppc_extproc_lab.workload.table` — the numbers, as tables;
* :mod:`~ppc_extproc_lab.workload.policies` — routing policies as service configs;
* :mod:`~ppc_extproc_lab.workload.oracle` — the client-side cache oracle;
* :mod:`~ppc_extproc_lab.workload.experiment` — one policy on a fresh ``LocalCluster``;
* :mod:`~ppc_extproc_lab.workload.disturbance` — an engine restart mid-run (``EngineRestart``), outside
  traffic around the router (``OutsideTraffic``);
* :mod:`~ppc_extproc_lab.workload.probes` / :mod:`~ppc_extproc_lab.workload.progress` — CPU, decision
  latency, a progress line.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ppc_extproc_lab.workload.disturbance import EngineRestart, RestartRecord
    from ppc_extproc_lab.workload.experiment import ClusterPlan, PolicyRun, run_policy, stage_summaries
    from ppc_extproc_lab.workload.generator import Arrival, Conversation, Workload, arrivals
    from ppc_extproc_lab.workload.oracle import OracleTarget
    from ppc_extproc_lab.workload.policies import ALL_POLICIES, BENCHMARK_POLICIES, Policy, policy
    from ppc_extproc_lab.workload.progress import ProgressLine
    from ppc_extproc_lab.workload.report import RequestRecord, Summary, percentile, summarize
    from ppc_extproc_lab.workload.runner import FixedTarget, Progress, RunResult, Target, WorkloadRunner
    from ppc_extproc_lab.workload.spec import EngineProfile, Stage, WorkloadSpec, staircase
    from ppc_extproc_lab.workload.table import format_table

# Names resolve on first use, so ``import ppc_extproc_lab.workload.spec`` stays cheap (the CLI
# builds its parser from it) while ``from ppc_extproc_lab.workload import run_policy`` still works.
_EXPORTS: dict[str, str] = {
    "ALL_POLICIES": "ppc_extproc_lab.workload.policies",
    "Arrival": "ppc_extproc_lab.workload.generator",
    "BENCHMARK_POLICIES": "ppc_extproc_lab.workload.policies",
    "ClusterPlan": "ppc_extproc_lab.workload.experiment",
    "Conversation": "ppc_extproc_lab.workload.generator",
    "EngineProfile": "ppc_extproc_lab.workload.spec",
    "EngineRestart": "ppc_extproc_lab.workload.disturbance",
    "FixedTarget": "ppc_extproc_lab.workload.runner",
    "OracleTarget": "ppc_extproc_lab.workload.oracle",
    "Policy": "ppc_extproc_lab.workload.policies",
    "PolicyRun": "ppc_extproc_lab.workload.experiment",
    "Progress": "ppc_extproc_lab.workload.runner",
    "ProgressLine": "ppc_extproc_lab.workload.progress",
    "RequestRecord": "ppc_extproc_lab.workload.report",
    "RestartRecord": "ppc_extproc_lab.workload.disturbance",
    "RunResult": "ppc_extproc_lab.workload.runner",
    "Stage": "ppc_extproc_lab.workload.spec",
    "Summary": "ppc_extproc_lab.workload.report",
    "Target": "ppc_extproc_lab.workload.runner",
    "Workload": "ppc_extproc_lab.workload.generator",
    "WorkloadRunner": "ppc_extproc_lab.workload.runner",
    "WorkloadSpec": "ppc_extproc_lab.workload.spec",
    "arrivals": "ppc_extproc_lab.workload.generator",
    "format_table": "ppc_extproc_lab.workload.table",
    "percentile": "ppc_extproc_lab.workload.report",
    "policy": "ppc_extproc_lab.workload.policies",
    "run_policy": "ppc_extproc_lab.workload.experiment",
    "stage_summaries": "ppc_extproc_lab.workload.experiment",
    "staircase": "ppc_extproc_lab.workload.spec",
    "summarize": "ppc_extproc_lab.workload.report",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = [
    "ALL_POLICIES",
    "BENCHMARK_POLICIES",
    "Arrival",
    "ClusterPlan",
    "Conversation",
    "EngineProfile",
    "EngineRestart",
    "FixedTarget",
    "OracleTarget",
    "Policy",
    "PolicyRun",
    "Progress",
    "ProgressLine",
    "RequestRecord",
    "RestartRecord",
    "RunResult",
    "Stage",
    "Summary",
    "Target",
    "Workload",
    "WorkloadRunner",
    "WorkloadSpec",
    "arrivals",
    "format_table",
    "percentile",
    "policy",
    "run_policy",
    "stage_summaries",
    "staircase",
    "summarize",
]
