"""Engine crashes through the real Envoy (issue #11, item 9): mock engines killed with SIGKILL under
traffic and restarted empty, the service deciding from its KV-event subscribers, Envoy's
answers and nothing else. Figures over more cycles: ``benchmarks/bench_faults.py``."""

from __future__ import annotations

from collections.abc import Iterator

import fault_tally as tally
import pytest

from ppc_extproc_lab.localcluster import LocalCluster
from ppc_extproc_lab.localcluster.faults import kill_under_traffic, restart_staleness

pytestmark = pytest.mark.integration

FAST_ENGINES = ["--prefill-tokens-per-s", "400000", "--decode-ms-per-token", "1"]
STALE_WINDOW_SECONDS = 0.5


@pytest.fixture(scope="module", params=[True, False], ids=["replay", "no-replay"])
def cluster(request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    with LocalCluster(num_engines=3, block_size=16, num_blocks=2048, engine_args=FAST_ENGINES,
                      replay=request.param) as c:  # fmt: skip
        yield c


def test_a_killed_engine_costs_at_most_one_request(cluster: LocalCluster) -> None:
    death = kill_under_traffic(cluster, victim=1, clients=1, before=20, while_dead=60)
    tally.add("engine kill -9: requests sent while dead", death.sent_while_dead)
    tally.add("engine kill -9: requests lost", death.lost)
    assert death.lost <= 1, death
    assert death.routed_to_dead_after_first_failure == 0, death


def test_a_restarted_engine_gets_no_prediction_from_its_old_entries(cluster: LocalCluster) -> None:
    report = restart_staleness(cluster, prefix_blocks=16, probes=30)
    tally.add("engine restart: probes of the old prefix", report.probes)
    tally.add("engine restart: stale predictions", report.stale_predictions)
    assert report.stale_window_seconds <= STALE_WINDOW_SECONDS, report
    assert report.stale_predictions == 0, report
