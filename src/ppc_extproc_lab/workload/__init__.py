"""The shared-prefix, multi-turn workload: generator, runner, report — for the demo and benchmarks.

Importing this package starts nothing and imports its modules on first use.

* :mod:`~ppc_extproc.workload.spec` — ``WorkloadSpec``, arrival ``Stage``s, ``EngineProfile``;
* :mod:`~ppc_extproc.workload.generator` — seeded token ids, Poisson ``arrivals``, conversations;
* :mod:`~ppc_extproc.workload.text` — the same workload as text (string, chat or token-id forms);
* :mod:`~ppc_extproc.workload.clients` — the request forms on the wire (aiohttp, ``openai``);
* :mod:`~ppc_extproc.workload.runner` — ``WorkloadRunner``: streaming, per-request records;
* :mod:`~ppc_extproc.workload.report` / :mod:`~ppc_extproc.workload.table` — the numbers, as tables;
* :mod:`~ppc_extproc.workload.policies` — routing policies as service configs;
* :mod:`~ppc_extproc.workload.oracle` — the client-side cache oracle;
* :mod:`~ppc_extproc.workload.experiment` — one policy on a fresh ``LocalCluster``;
* :mod:`~ppc_extproc.workload.disturbance` — an engine restart mid-run (``EngineRestart``), outside
  traffic around the router (``OutsideTraffic``);
* :mod:`~ppc_extproc.workload.probes` / :mod:`~ppc_extproc.workload.progress` — CPU, decision
  latency, a progress line.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ppc_extproc.workload.disturbance import EngineRestart, RestartRecord
    from ppc_extproc.workload.experiment import ClusterPlan, PolicyRun, run_policy, stage_summaries
    from ppc_extproc.workload.generator import Arrival, Conversation, Workload, arrivals
    from ppc_extproc.workload.oracle import OracleTarget
    from ppc_extproc.workload.policies import ALL_POLICIES, BENCHMARK_POLICIES, Policy, policy
    from ppc_extproc.workload.progress import ProgressLine
    from ppc_extproc.workload.report import RequestRecord, Summary, percentile, summarize
    from ppc_extproc.workload.runner import FixedTarget, Progress, RunResult, Target, WorkloadRunner
    from ppc_extproc.workload.spec import EngineProfile, Stage, WorkloadSpec, staircase
    from ppc_extproc.workload.table import format_table

# Names resolve on first use, so ``import ppc_extproc.workload.spec`` stays cheap (the CLI
# builds its parser from it) while ``from ppc_extproc.workload import run_policy`` still works.
_EXPORTS: dict[str, str] = {
    "ALL_POLICIES": "ppc_extproc.workload.policies",
    "Arrival": "ppc_extproc.workload.generator",
    "BENCHMARK_POLICIES": "ppc_extproc.workload.policies",
    "ClusterPlan": "ppc_extproc.workload.experiment",
    "Conversation": "ppc_extproc.workload.generator",
    "EngineProfile": "ppc_extproc.workload.spec",
    "EngineRestart": "ppc_extproc.workload.disturbance",
    "FixedTarget": "ppc_extproc.workload.runner",
    "OracleTarget": "ppc_extproc.workload.oracle",
    "Policy": "ppc_extproc.workload.policies",
    "PolicyRun": "ppc_extproc.workload.experiment",
    "Progress": "ppc_extproc.workload.runner",
    "ProgressLine": "ppc_extproc.workload.progress",
    "RequestRecord": "ppc_extproc.workload.report",
    "RestartRecord": "ppc_extproc.workload.disturbance",
    "RunResult": "ppc_extproc.workload.runner",
    "Stage": "ppc_extproc.workload.spec",
    "Summary": "ppc_extproc.workload.report",
    "Target": "ppc_extproc.workload.runner",
    "Workload": "ppc_extproc.workload.generator",
    "WorkloadRunner": "ppc_extproc.workload.runner",
    "WorkloadSpec": "ppc_extproc.workload.spec",
    "arrivals": "ppc_extproc.workload.generator",
    "format_table": "ppc_extproc.workload.table",
    "percentile": "ppc_extproc.workload.report",
    "policy": "ppc_extproc.workload.policies",
    "run_policy": "ppc_extproc.workload.experiment",
    "stage_summaries": "ppc_extproc.workload.experiment",
    "staircase": "ppc_extproc.workload.spec",
    "summarize": "ppc_extproc.workload.report",
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
