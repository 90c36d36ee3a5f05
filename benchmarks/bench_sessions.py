"""Session affinity through three service replicas behind one Envoy, with one pinned engine killed.

    python benchmarks/bench_sessions.py [--runs 3] [--sessions 50] [--turns 10] [--clients 8]

Three mock engines, three service replicas and Envoy (``envoy-override-host.yaml``: a connection
refused is retried on the next address of the picker's two-endpoint list) on loopback. 50
sessions × 10 turns (each turn's prompt extends the last, header ``x-session-id``), sent round by
round by 8 client threads; after turn 5 the engine serving the most sessions is SIGKILLed between
rounds. Each run twice: bindings shared through a real Valkey (``sharedStore``), and local to each
replica (llm-d's per-replica map). ``tests/integration/sessions/test_sessions_bench.py`` asserts
one shared run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from _common import header

from ppc_extproc.observability.logging import configure_logging
from ppc_extproc_lab.localcluster import LocalCluster
from ppc_extproc_lab.localcluster.sessions import SessionReport, run_sessions, session_cluster_config
from ppc_extproc_lab.valkey import start_valkey

FAST_ENGINES = ["--prefill-tokens-per-s", "400000", "--decode-ms-per-token", "1"]


def _admin(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def store_stats(cluster: LocalCluster) -> dict[str, int]:
    """Summed store counters of the replicas' session-affinity-scorer."""
    totals: dict[str, int] = {}
    for url in cluster.service_admin_urls:
        plugin = _admin(url + "/debug/state")["plugins"]["session-affinity-scorer"]
        for key in ("storeHits", "storeErrors", "storeAdopted", "localFallbacks"):
            totals[key] = totals.get(key, 0) + int(plugin[key])
    return totals


def decision_ms(cluster: LocalCluster) -> float:
    """Median decision time (``decisionMs``: body parsed → decision, the store read included) of
    the session requests the replicas still list in ``/debug/decisions``."""
    values = [d["decisionMs"] for url in cluster.service_admin_urls
              for d in _admin(url + "/debug/decisions")["decisions"] if "-turn-" in d["requestId"]]  # fmt: skip
    return statistics.median(values) if values else float("nan")


def run(store_url: str | None, args: argparse.Namespace, seed: int) -> tuple[SessionReport, dict[str, int], float]:
    config = session_cluster_config(store_url)
    with LocalCluster(num_engines=3, service_replicas=3, block_size=16, num_blocks=4096, engine_args=FAST_ENGINES,
                      envoy_variant="override-host", service_config=config) as cluster:  # fmt: skip
        report = run_sessions(cluster, sessions=args.sessions, turns=args.turns, kill_after_turn=args.kill_after - 1,
                              clients=args.clients, seed=seed)  # fmt: skip
        return report, store_stats(cluster), decision_ms(cluster)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--sessions", type=int, default=50)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--kill-after", type=int, default=5, help="turns before the kill")
    parser.add_argument("--clients", type=int, default=8)
    args = parser.parse_args()
    configure_logging("console", "error")
    header(f"session affinity: {args.sessions} sessions × {args.turns} turns, 3 replicas, engine killed "
           f"after turn {args.kill_after}")  # fmt: skip
    print(f"{'bindings':<9}{'run':>4}{'requests':>9}{'errors':>7}{'kept':>9}{'split':>6}"
          f"{'max/mean 3 pods':>16}{'max/mean 2 pods':>16}{'p50 ms':>8}{'p99 ms':>8}{'decision':>10}  store")  # fmt: skip
    with start_valkey() as valkey:
        for mode, url in (("shared", valkey.url), ("local", None)):
            for i in range(args.runs):
                report, stats, decided = run(url, args, seed=i)
                kept = report.affinity_kept()
                before = report.sessions_per_engine(final=False)
                after = report.sessions_per_engine(final=True)
                print(f"{mode:<9}{i + 1:>4}{len(report.outcomes):>9}{report.errors:>7}"
                      f"{f'{kept}/{report.sessions}':>9}{report.sessions - kept:>6}"
                      f"{report.max_over_mean(before):>16.2f}{report.max_over_mean(after):>16.2f}"
                      f"{report.latency_ms(0.5):>8.1f}{report.latency_ms(0.99):>8.1f}{decided:>8.2f}ms  {stats}")  # fmt: skip


if __name__ == "__main__":
    main()
