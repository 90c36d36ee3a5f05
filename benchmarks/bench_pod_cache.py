"""What ``podCacheSize``'s per-key entry LRU costs the index's writes, on a 100K-token prompt at
block size 16 (6,250 keys), 16 endpoints, ``podCacheSize`` 10. CPU time (``process_time``), the
best of several runs: the machine may be shared. Compare two checkouts with ``PYTHONPATH``:

    python benchmarks/bench_pod_cache.py
    PYTHONPATH=/tmp/base/src python benchmarks/bench_pod_cache.py     # the code before a change
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

from _common import header

from ppc_extproc.index import InMemoryIndex, PodEntry

ENDPOINTS = [f"10.0.0.{i}:8000" for i in range(16)]
N_KEYS = 6250
KEYS = list(range(1, N_KEYS + 1))


def _index(fill: list[int]) -> InMemoryIndex:
    """Entry bits registered in endpoint order, then the prompt's keys filled by ``fill``'s
    endpoints in that order (a list out of endpoint order gives keys out of bit order)."""
    index = InMemoryIndex(size=100_000, pod_cache_size=10)
    for endpoint in ENDPOINTS:
        index.add(None, [0], [PodEntry(endpoint, "gpu")])
    for i in fill:
        index.add(None, KEYS, [PodEntry(ENDPOINTS[i], "gpu")])
    return index


def best(setup: Callable[[], InMemoryIndex], op: Callable[[InMemoryIndex], None], runs: int = 15) -> float:
    times = []
    for _ in range(runs):
        index = setup()
        start = time.process_time()
        op(index)
        times.append(time.process_time() - start)
    return min(times) * 1e3


def main() -> None:
    header("podCacheSize entry LRU: index writes of one 100K-token prompt (6,250 keys)")
    shuffled = list(range(10))
    random.Random(3).shuffle(shuffled)
    spec = PodEntry(ENDPOINTS[12], "", speculative=True)
    seeding: dict[str, tuple[Callable[[], InMemoryIndex], PodEntry]] = {
        "new keys": (lambda: _index([]), spec),
        "full keys in bit order, a new entry": (lambda: _index(list(range(10))), spec),
        "full keys out of bit order, a new entry": (lambda: _index(shuffled), spec),
        "full keys, re-add the oldest entry": (lambda: _index(shuffled), PodEntry(ENDPOINTS[shuffled[0]], "gpu")),
        "full keys, re-add the newest entry": (lambda: _index(shuffled), PodEntry(ENDPOINTS[shuffled[-1]], "gpu")),
    }
    print("One add over all keys (speculative seeding's bulk path):")
    for name, (setup, entry) in seeding.items():
        print(f"  {name:42s} {best(setup, lambda index, e=entry: index.add(None, KEYS, [e])):7.3f} ms")

    print("An engine confirming a seeded prompt: its gpu entry (a lower bit) after its speculative one,")
    print("in BlockStored events of B blocks (the KV-event path):")
    gpu, seeded = PodEntry(ENDPOINTS[5], "gpu"), PodEntry(ENDPOINTS[5], "", speculative=True)

    def confirmed() -> InMemoryIndex:
        index = _index([0, 1, 2])
        index.add(None, KEYS, [seeded])
        return index

    for size in (4, 16, 64):
        def events(index: InMemoryIndex, size: int = size) -> None:
            for i in range(0, N_KEYS, size):
                chunk = KEYS[i : i + size]
                index.add([k + 10**6 for k in chunk], chunk, [gpu])

        print(f"  events of {size:2d} blocks {best(confirmed, events, runs=7):29.3f} ms")


if __name__ == "__main__":
    main()
