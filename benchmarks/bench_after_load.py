"""Does a 100K-token decision stay slower after a load phase, and does that fade? The shipped
configuration over gRPC (16 live mock engines, block size 16) next to the trivial ext_proc:
idle before any load, then ``--load-seconds`` of agentic load (``bench_decision.AgenticLoad``),
then idle again at each of ``--delays`` seconds after the load stopped.

    python benchmarks/bench_after_load.py [--rate 3] [--load-seconds 20] [--delays 0,20,60]
"""

from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import header
from _grpc_extproc import measure_grpc
from bench_decision import AgenticLoad, grpc_bodies, ingestion_settles, load_bodies

from ppc_extproc_lab.localcluster import LocalCluster
from ppc_extproc_lab.localcluster.ports import free_port


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=3.0, help="agentic load, fresh 100K-token prompts a second")
    parser.add_argument("--load-seconds", type=float, default=20.0)
    parser.add_argument("--delays", default="0,20,60", help="seconds after the load stopped to measure again")
    parser.add_argument("--requests", type=int, default=60, help="sequential requests per service per round (2 rounds)")
    args = parser.parse_args()
    delays = [float(d) for d in args.delays.split(",") if d]
    header("100K-token decisions over gRPC before and after a load phase")
    bodies = grpc_bodies("repeated", 100_000, 4, random.Random(1))
    with LocalCluster(num_engines=16, engines_per_process=16, block_size=16, num_blocks=32768, with_envoy=False,
                      service_args=["--log-level", "warning"], startup_timeout=180) as cluster:  # fmt: skip
        port = free_port()
        trivial = subprocess.Popen([sys.executable, str(Path(__file__).parent / "_grpc_extproc.py"), "trivial", str(port)],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        try:
            ours, floor = f"127.0.0.1:{cluster.grpc_ports[0]}", f"127.0.0.1:{port}"

            def phase(label: str) -> None:
                mine: list[float] = []
                theirs: list[float] = []
                for _ in range(2):  # interleaved: the machine's speed drifts
                    mine += measure_grpc(ours, bodies, args.requests)
                    theirs += measure_grpc(floor, bodies, args.requests)
                ours_ms, floor_ms = statistics.median(mine) * 1e3, statistics.median(theirs) * 1e3
                print(f"{label:<26} ppc-extproc p50 {ours_ms:6.3f}  trivial p50 {floor_ms:6.3f}  "
                      f"ours − trivial {ours_ms - floor_ms:+.3f} ms", flush=True)  # fmt: skip

            phase("idle, before any load")
            load = AgenticLoad(ours, cluster.engine_urls, args.rate, load_bodies(4))
            load.start()
            time.sleep(args.load_seconds)
            load.stop.set()
            load.join(60)
            settled = ingestion_settles(cluster.service_admin_urls[0])
            stopped = time.monotonic()
            print(f"load: {args.rate:g} req/s for {args.load_seconds:g} s, {load.failed} failed; "
                  f"its KV events ingested {settled:.1f} s after it stopped")  # fmt: skip
            for delay in delays:
                time.sleep(max(0.0, stopped + delay - time.monotonic()))
                phase(f"idle, {delay:g} s after the load")
        finally:
            trivial.terminate()
            trivial.wait(10)


if __name__ == "__main__":
    main()
