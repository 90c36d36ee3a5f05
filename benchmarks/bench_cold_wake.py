"""What the same Python work costs on a thread that just woke up: one KV-event batch (decode +
apply, 1–8 blocks of 16 tokens, as ``bench_ingest_sockets.py`` sends) back to back, and after a
sleep of 0.1–20 ms before each batch (a decode step's block arrives every few hundred ms).

CPU is the thread's own (``time.thread_time``) around each batch, so the sleep itself is not
counted; what grows with the sleep is the cost of running the same code on cold caches.

    PYTHONPATH=src python benchmarks/bench_cold_wake.py [--batches 1000] [--cpu 0]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from _common import header
from bench_ingest_sockets import MODEL, events_bytes, payload

from ppc_extproc.blockkeys import TokenProcessor
from ppc_extproc.events.apply import EventApplier
from ppc_extproc.events.decode import decode_batch
from ppc_extproc.events.stats import IngestStats
from ppc_extproc.index import InMemoryIndex

SLEEPS_MS = (0.0, 0.1, 1.0, 5.0, 20.0, 0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=1000, help="batches per row (a quarter for sleeps ≥ 5 ms)")
    parser.add_argument("--cpu", type=int, default=None, help="pin this process to one CPU")
    args = parser.parse_args()
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    header("CPU per KV-event batch, back to back vs after a sleep")
    if args.cpu is not None:
        print(f"pinned to CPU {args.cpu}")
    rng = random.Random(1)
    state: dict[str, Any] = {"parent": None, "batches": 0}
    batches = (events_bytes(rng, state) for _ in range(len(SLEEPS_MS) * args.batches))
    bodies = [payload(events, time.time()) for events, _ in batches]
    applier = EventApplier(InMemoryIndex(size=1_000_000), TokenProcessor(), IngestStats())
    clock = time.thread_time
    print(f"{'sleep before each batch':>24}  {'batches':>7}  {'µs CPU per batch, median':>24}  {'mean':>7}  "
          f"{'× back to back':>14}")
    first: float | None = None
    for sleep_ms in SLEEPS_MS:
        count = args.batches if sleep_ms < 5 else args.batches // 4
        chunk, bodies = bodies[:count], bodies[count:]
        costs = []
        for body in chunk:
            if sleep_ms:
                time.sleep(sleep_ms / 1e3)
            started = clock()
            applier.apply_batch("10.0.0.1:8000", MODEL, decode_batch(body))
            costs.append(clock() - started)
        median = statistics.median(costs) * 1e6
        first = median if first is None else first
        label = f"{sleep_ms:g} ms" if sleep_ms else "none (back to back)"
        print(f"{label:>24}  {count:>7}  {median:>24.1f}  {statistics.fmean(costs) * 1e6:>7.1f}  {median / first:>13.1f}×")


if __name__ == "__main__":
    main()
