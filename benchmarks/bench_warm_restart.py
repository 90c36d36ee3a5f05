"""Warm-restart snapshot: take, write, and load an index of N blocks (default 1,000,000).

Run by hand:  python benchmarks/bench_warm_restart.py [--blocks 1000000] [--endpoints 16] [--repeat 3]

"load" is what a restarting service spends before it is ready: read the file, check its header,
length and sha256, decode it, and rebuild the index and the applier's tables. The index is built
directly (64-block chains per endpoint, every block also mapped from a 1:1 engine key), not
through events, which would only make the setup slower.
"""

from __future__ import annotations

import argparse
import gc
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import header

from ppc_extproc.blockkeys import TokenProcessor, TokenProcessorConfig
from ppc_extproc.events.apply import EventApplier
from ppc_extproc.events.snapshot_format import write_snapshot
from ppc_extproc.events.stats import IngestStats
from ppc_extproc.events.transport.restore import RestoreTable
from ppc_extproc.events.transport.source import Source
from ppc_extproc.events.warm_restart import config_hash, load_snapshot, take_snapshot
from ppc_extproc.ids import EndpointId, EngineKey, RequestKey
from ppc_extproc.index import EngineScope, InMemoryIndex, PodEntry

HASH = config_hash(TokenProcessorConfig())
CAP = 4 << 30


def _applier(size: int) -> EventApplier:
    return EventApplier(InMemoryIndex(size=size), TokenProcessor(), IngestStats())


def build(blocks: int, endpoints: int) -> tuple[EventApplier, list[Source]]:
    applier = _applier(max(2 * blocks, 2))
    rng = random.Random(1)
    names = [f"10.0.{i // 250}.{i % 250 + 1}:8000" for i in range(endpoints)]
    sources = []
    for name in names:
        entry = applier.entries.admit(name, "gpu", 0)[0]
        assert entry is not None
        sources.append(Source(name, applier.stats.source(name), f"tcp://{name}", ""))
    added = 0
    while added < blocks:
        n = min(64, blocks - added)
        keys = [RequestKey(rng.getrandbits(64)) for _ in range(n)]
        engine = [EngineKey(rng.getrandbits(64)) for _ in range(n)]
        # Most blocks on one endpoint, a fifth shared by two (as hot prefixes are).
        owners = [rng.randrange(endpoints)] + ([rng.randrange(endpoints)] if rng.random() < 0.2 else [])
        for owner in set(owners):
            entry = PodEntry(EndpointId(names[owner]), "gpu", group=0)
            applier.index.add(engine, keys, [entry], EngineScope(entry.endpoint, 0, 0))
        added += n
    for i, src in enumerate(sources):
        src.last_seq, src.last_payload, src.topic = 10_000 + i, b"x" * 200, f"kv@{src.endpoint}@m".encode()
    return applier, sources


def _reader(index: InMemoryIndex, done: threading.Event, stalls: list[float]) -> None:
    """The request path during a take: lookups back to back, each one's duration recorded."""
    key = [RequestKey(1)]
    while not done.is_set():
        t = time.perf_counter()
        index.lookup(key)
        stalls.append(time.perf_counter() - t)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=1_000_000)
    parser.add_argument("--endpoints", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    header("warm-restart snapshot")
    started = time.perf_counter()
    applier, sources = build(args.blocks, args.endpoints)
    stats = applier.index.stats()
    print(f"index: {stats.request_keys:,} request keys, {stats.engine_keys:,} engine keys, "
          f"{args.endpoints} endpoints (built in {time.perf_counter() - started:.1f} s)")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kv-index.snapshot"
        for run in range(args.repeat):
            gc.collect()
            stalls: list[float] = []
            done = threading.Event()
            reader = threading.Thread(target=_reader, args=(applier.index, done, stalls))
            reader.start()
            t0 = time.perf_counter()
            state = take_snapshot(applier, sources, HASH)
            t1 = time.perf_counter()
            done.set()
            reader.join()
            size = write_snapshot(path, state, CAP)
            t2 = time.perf_counter()
            del state
            loaded = _applier(max(2 * args.blocks, 2))
            gc.collect()
            t3 = time.perf_counter()
            result = load_snapshot(path, CAP, HASH, loaded, loaded.stats, RestoreTable(), 60.0)
            t4 = time.perf_counter()
            assert result is not None and len(loaded.index) == stats.request_keys
            print(f"run {run + 1}: take {t1 - t0:.3f} s, write {t2 - t1:.3f} s ({size / 1e6:.1f} MB), "
                  f"load {t4 - t3:.3f} s; a concurrent lookup's longest wait during take "
                  f"{max(stalls) * 1e3:.1f} ms over {len(stalls)} lookups")  # fmt: skip
            del loaded


if __name__ == "__main__":
    main()
