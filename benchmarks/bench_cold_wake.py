"""What the same work costs on a thread that just woke up, back to back and after a sleep of
0.1–20 ms before each step (a decode step's block arrives every few hundred ms). Three steps:

* ``batch``: one KV-event batch decoded and applied (1–8 blocks of 16 tokens, as
  ``bench_ingest_sockets.py`` sends): the ingestion thread's Python;
* ``c``: one C call of a few µs (``native.xxh64_chain`` over 64 blocks of 16 tokens): what the
  step would cost if it were compiled;
* ``empty``: a call that does nothing.

CPU is the thread's own (``time.thread_time``) around each step, so the sleep itself is not
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from _common import header
from bench_ingest_sockets import MODEL, events_bytes, payload

from ppc_extproc import native
from ppc_extproc.blockkeys import TokenProcessor
from ppc_extproc.events.apply import EventApplier
from ppc_extproc.events.decode import decode_batch
from ppc_extproc.events.stats import IngestStats
from ppc_extproc.index import InMemoryIndex

SLEEPS_MS = (0.0, 0.1, 1.0, 5.0, 20.0, 0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=1000, help="steps per row (a quarter for sleeps ≥ 5 ms)")
    parser.add_argument("--cpu", type=int, default=None, help="pin this process to one CPU")
    args = parser.parse_args()
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    header("CPU per step, back to back vs after a sleep")
    if args.cpu is not None:
        print(f"pinned to CPU {args.cpu}")
    rng = random.Random(1)
    state: dict[str, Any] = {"parent": None, "batches": 0}
    batches = (events_bytes(rng, state) for _ in range(len(SLEEPS_MS) * args.batches))
    bodies = iter([payload(events, time.time()) for events, _ in batches])
    applier = EventApplier(InMemoryIndex(size=1_000_000), TokenProcessor(), IngestStats())
    tokens = b"".join(rng.randrange(150_000).to_bytes(4, "little") for _ in range(64 * 16))

    def batch() -> None:
        applier.apply_batch("10.0.0.1:8000", MODEL, decode_batch(next(bodies)))

    def c_call() -> None:
        native.xxh64_chain(1, tokens, 16, 64, None)

    def empty() -> None:
        pass

    steps: dict[str, Callable[[], None]] = {"batch": batch, "c": c_call, "empty": empty}
    clock = time.thread_time
    print("µs of CPU per step, median (× the first row's)")
    print(f"{'sleep before each step':>24}  {'steps':>6}" + "".join(f"  {name:>16}" for name in steps))
    first: dict[str, float] = {}
    for sleep_ms in SLEEPS_MS:
        count = args.batches if sleep_ms < 5 else args.batches // 4
        cells = []
        for name, step in steps.items():
            costs = []
            for _ in range(count):
                if sleep_ms:
                    time.sleep(sleep_ms / 1e3)
                started = clock()
                step()
                costs.append(clock() - started)
            median = statistics.median(costs) * 1e6
            first.setdefault(name, median)
            cells.append(f"{median:>8.1f} ({median / first[name]:>4.1f}×)")
        label = f"{sleep_ms:g} ms" if sleep_ms else "none (back to back)"
        print(f"{label:>24}  {count:>6}" + "".join(f"  {cell:>16}" for cell in cells))


if __name__ == "__main__":
    main()
