"""Engine crashes through the real Envoy: requests lost per engine death and the stale window after
a restart, over many cycles (``tests/reliability/test_engine_faults.py`` asserts one of each).

    python benchmarks/bench_faults.py [--cycles 10] [--clients 1 4]

Three mock engines, the service and Envoy on loopback, once with replay endpoints and once
without. Each cycle SIGKILLs an engine under traffic (``kill_under_traffic``), then caches a
prefix on an engine, crashes and restarts it, and sends the prefix again (``restart_staleness``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import header

from ppc_extproc.observability.logging import configure_logging
from ppc_extproc_lab.localcluster import LocalCluster
from ppc_extproc_lab.localcluster.faults import kill_under_traffic, restart_staleness

FAST_ENGINES = ["--prefill-tokens-per-s", "400000", "--decode-ms-per-token", "1"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=10)
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 4])
    args = parser.parse_args()
    configure_logging("console", "error")
    header("engine faults through Envoy (3 mock engines)")
    print(f"{'replay':<8}{'clients':>8}{'deaths':>8}{'sent dead':>11}{'lost':>6}{'lost max':>10}"
          f"{'to dead':>9}{'down after':>12}{'serving after':>15}")  # fmt: skip
    staleness = []
    for replay in (True, False):
        with LocalCluster(num_engines=3, block_size=16, num_blocks=2048, engine_args=FAST_ENGINES,
                          replay=replay) as cluster:  # fmt: skip
            for clients in args.clients:
                deaths = [kill_under_traffic(cluster, victim=c % 3, clients=clients, seed=c) for c in range(args.cycles)]
                print(f"{'yes' if replay else 'no':<8}{clients:>8}{len(deaths):>8}"
                      f"{sum(d.sent_while_dead for d in deaths):>11}{sum(d.lost for d in deaths):>6}"
                      f"{max(d.lost for d in deaths):>10}{sum(d.routed_to_dead_after_first_failure for d in deaths):>9}"
                      f"{statistics.median(d.seconds_to_unroutable for d in deaths) * 1e3:>9.0f} ms"
                      f"{statistics.median(d.seconds_to_serving_again for d in deaths) * 1e3:>12.0f} ms")  # fmt: skip
            for c in range(args.cycles):
                staleness.append((replay, restart_staleness(cluster, probes=30, seed=100 + c)))
    print("\n(down after: kill → held down in /debug/state, median; serving after: engine ready → first request it serves, median)")
    print(f"\n{'replay':<8}{'restarts':>9}{'probes':>8}{'stale':>7}{'stale window max':>18}{'routable after (median, max)':>30}")
    for replay in (True, False):
        rows = [r for rp, r in staleness if rp is replay]
        routable = [r.seconds_to_routable * 1e3 for r in rows]
        print(f"{'yes' if replay else 'no':<8}{len(rows):>9}{sum(r.probes for r in rows):>8}"
              f"{sum(r.stale_predictions for r in rows):>7}{max(r.stale_window_seconds for r in rows) * 1e3:>15.0f} ms"
              f"{statistics.median(routable):>20.0f} ms, {max(routable):.0f} ms")  # fmt: skip


if __name__ == "__main__":
    main()
