"""``ppc-extproc demo --pd``: its flags, the P/D layout it asks for, and its one-line mistakes."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from ppc_extproc_lab.demo.cli import add_arguments, options_from_args
from ppc_extproc_lab.demo.run import failures
from ppc_extproc_lab.localcluster.pd import endpoints_document, with_file_discovery
from ppc_extproc_lab.workload import ClusterPlan, PolicyRun
from ppc_extproc_lab.workload.policies import policy
from ppc_extproc_lab.workload.report import RequestRecord, summarize
from ppc_extproc_lab.workload.runner import RunResult


def parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args(list(argv))


def test_pd_compares_pd_with_the_same_engines_aggregated() -> None:
    assert options_from_args(parse("--pd")).policies == ("pd", "default")
    assert options_from_args(parse()).policies == ("default", "round-robin")
    assert options_from_args(parse("--pd", "--policies", "pd,round-robin")).policies == ("pd", "round-robin")
    assert policy("pd").pd and not policy("default").pd


def test_pd_roles() -> None:
    assert ClusterPlan(engines=4).pd_roles == ["prefill", "prefill", "decode", "decode"]
    assert ClusterPlan(engines=5, prefill_engines=1).pd_roles == ["prefill", *["decode"] * 4]
    with pytest.raises(ValueError, match="prefill engines"):
        _ = ClusterPlan(engines=2, prefill_engines=2).pd_roles


def test_prefill_engines_must_leave_a_decode_pod() -> None:
    with pytest.raises(ValueError, match="--prefill-engines"):
        options_from_args(parse("--pd", "--engines", "3", "--prefill-engines", "3"))
    out = subprocess.run([sys.executable, "-m", "ppc_extproc", "demo", "--pd", "--engines", "2", "--prefill-engines", "2"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "--prefill-engines" in out.stderr


def test_labelled_file_discovery() -> None:
    doc = endpoints_document(["127.0.0.2", "127.0.0.3"], 8000, ["prefill", ""])
    assert doc == [{"name": "prefill-0", "address": "127.0.0.2", "port": 8000, "labels": {"llm-d.ai/role": "prefill"}},
                   {"name": "engine-1", "address": "127.0.0.3", "port": 8000}]
    config = with_file_discovery({"plugins": [{"type": "file-discovery", "name": "old"}], "dataLayer": {"sources": []}},
                                 Path("/tmp/e.yaml"))
    assert config["dataLayer"] == {"sources": [], "discovery": {"pluginRef": "lab-endpoints"}}
    assert config["plugins"] == [{"type": "file-discovery", "name": "lab-endpoints", "parameters": {"path": "/tmp/e.yaml"}}]


def _run(name: str, *, disaggregated: bool, cached: int) -> PolicyRun:
    rec = RequestRecord(0, 0, 0, 0, 0, 0.0, prompt_tokens=100, sent_s=0.0, first_token_s=0.1, done_s=0.2,
                        cached_tokens=cached, output_tokens=4, status=200,
                        kv_transfer="decode" if disaggregated else None)
    summary = summarize(name, [rec])
    return PolicyRun(policy(name), RunResult([rec], 1.0, 1.0), summary, [summary], [])


def test_check_of_a_pd_run_asks_for_disaggregation_not_a_better_hit_rate() -> None:
    assert failures([_run("pd", disaggregated=True, cached=10), _run("default", disaggregated=False, cached=90)],
                    check=True) == []
    assert failures([_run("pd", disaggregated=False, cached=10), _run("default", disaggregated=False, cached=90)],
                    check=True) == ["pd: no request was disaggregated"]
    assert failures([_run("default", disaggregated=False, cached=10), _run("round-robin", disaggregated=False, cached=90)],
                    check=True) == ["default does not beat round-robin on hit rate (10.0% vs 90.0%)"]
