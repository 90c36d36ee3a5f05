"""50 sessions × 10 turns through three replicas sharing bindings in a real Valkey, with the
engine serving the most sessions killed after turn 5 (``benchmarks/bench_sessions.py``, one run):
every session stays on one engine until its engine dies, then on one other; 0 errors; sessions
per engine max/mean ≤ 1.25 before and after the kill."""

from __future__ import annotations

import pytest

from ppc_extproc_lab.localcluster import LocalCluster
from ppc_extproc_lab.localcluster.sessions import run_sessions, session_cluster_config
from ppc_extproc_lab.valkey import ValkeyServer

pytestmark = pytest.mark.integration

FAST_ENGINES = ["--prefill-tokens-per-s", "400000", "--decode-ms-per-token", "1"]


def test_sessions_stay_put_until_their_engine_dies_then_rebind_without_errors(valkey_server: ValkeyServer) -> None:
    config = session_cluster_config(valkey_server.url)
    with LocalCluster(num_engines=3, service_replicas=3, block_size=16, num_blocks=4096, engine_args=FAST_ENGINES,
                      envoy_variant="override-host", service_config=config) as cluster:  # fmt: skip
        report = run_sessions(cluster, sessions=50, turns=10, kill_after_turn=4)
    assert report.victim is not None
    assert report.errors == 0, [o for o in report.outcomes if o.status != 200]
    pinned = report.pinned_before()
    assert len(pinned) == 50, "a session changed engine before any engine died"
    moved = [s for s, engine in pinned.items() if engine == report.victim]
    assert moved, "the killed engine served no session"
    assert report.affinity_kept() == 50, {s: report.served_by(s) for s in range(50)}
    before, after = report.sessions_per_engine(final=False), report.sessions_per_engine(final=True)
    assert len(before) == 3 and len(after) == 2 and report.victim not in after
    assert report.max_over_mean(before) <= 1.25, before
    assert report.max_over_mean(after) <= 1.25, after
