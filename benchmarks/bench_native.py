"""The request path's per-prompt C calls on long prompts (block size 16): the token-array read, and
the key chain plus the index's prefix probe with fresh key objects vs the objects of a recent
prompt (``reuse``: the dict then matches by identity), on a dict and on the extension's
``U64Map`` (keys inline) — warm, and with the CPU caches flushed before each call (as after
reading a large body). Then the index's bulk writes on a ``U64Map`` holding 3M other keys: a
fresh prompt's speculative entries (``fill``), their expiry (``remap`` to None) and a KV event's
engine keys (``swap_many``). Best and median of ``--repeats`` calls. Last, a table filled to
``--growth-keys`` by 12,500-key ``fill`` calls, as a generation of the index grows: the slowest
calls are the ones that cross a doubling. ``--native-so PATH`` times another build of ``_native``
(e.g. the code before a change).

    python benchmarks/bench_native.py [--repeats 60] [--growth-keys 5000000] [--native-so /tmp/base/_native.so]
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import orjson

sys.path.insert(0, str(Path(__file__).parent))
from _common import header


def _load(path: str | None) -> ModuleType:
    if path is None:
        from ppc_extproc import _native  # type: ignore[attr-defined]

        return _native
    spec = importlib.util.spec_from_file_location("_native", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_FLUSH = bytearray(64 << 20)


def _time(call: Callable[[], object], repeats: int, cold: bool = False) -> tuple[float, float]:
    samples = []
    for _ in range(repeats):
        if cold:
            _FLUSH[::64] = bytes(len(_FLUSH) // 64)  # evict the caches
        started = time.perf_counter()
        call()
        samples.append(time.perf_counter() - started)
    return min(samples) * 1e3, statistics.median(samples) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=60)
    parser.add_argument("--native-so", help="another build of the extension to time")
    parser.add_argument("--growth-keys", type=int, default=5_000_000, help="keys of the growth run (0: skip it)")
    args = parser.parse_args()
    header("bench_native: token-array read, key chain + prefix probe (block size 16)")
    native = _load(args.native_so)
    rng = random.Random(1)
    rows: list[str] = []
    print(f"{'tokens':>7}  {'array read min / p50 ms':>24}  {'chain+probe fresh min / p50':>28}  {'reused objects min / p50':>25}")
    for n_tokens in (100_000, 200_000):
        tokens = [rng.randrange(150_000) for _ in range(n_tokens)]
        body = orjson.dumps({"model": "m", "prompt": tokens, "max_tokens": 16})
        pos = body.index(b"[")
        found = native.json_uint32_array(body, pos)
        assert found is not None
        le32 = found[0]
        n_blocks = n_tokens // 16
        keys = native.xxh64_chain(0, le32, 16, n_blocks)
        # An index-sized dict: the prompt's keys among 800K others, inserted in between.
        index: dict[int, int] = {rng.getrandbits(64): 1 for _ in range(400_000)}
        index.update(dict.fromkeys(keys, 5))
        index.update({rng.getrandbits(64): 1 for _ in range(400_000)})
        old: dict[int, int] = {}
        read = _time(lambda: native.json_uint32_array(body, pos), args.repeats)
        fresh = _time(lambda: native.dict_prefix(index, old, native.xxh64_chain(0, le32, 16, n_blocks), 1 << 40),
                      args.repeats)  # fmt: skip
        cells = f"{read[0]:10.3f} / {read[1]:7.3f}    {fresh[0]:12.3f} / {fresh[1]:7.3f}"
        try:
            reused = _time(lambda: native.dict_prefix(index, old, native.xxh64_chain(0, le32, 16, n_blocks, keys),
                                                      1 << 40), args.repeats)  # fmt: skip
            cells += f"    {reused[0]:13.3f} / {reused[1]:7.3f}"
        except TypeError:  # a build without ``reuse``
            cells += f"    {'-':>23}"
        table_type = getattr(native, "U64Map", None)
        for cold in (False, True):
            for name, kind in (("dict", dict), ("U64Map", table_type)):
                if kind is None:
                    continue
                table = kind()
                # Sized as the LRU sizes a generation; dict and builds from before plan_for cannot be.
                if hasattr(table, "plan_for"):
                    table.plan_for(len(index))
                table.update(index)
                empty = kind()
                fresh_keys = native.xxh64_chain(0, le32, 16, n_blocks)
                probe = _time(lambda: native.dict_prefix(table, empty, fresh_keys, 1 << 40), args.repeats, cold)
                rows.append(f"{n_tokens:>7}  {name:>7} {'cold' if cold else 'warm':>5}  {probe[0]:8.3f} / {probe[1]:7.3f}")
        print(f"{n_tokens:>7}  {cells}")
    print("\nprobe alone (dict_prefix over the prompt's fresh keys, 800K other keys), ms min / p50")
    print(f"{'tokens':>7}  {'table':>7} {'cache':>5}  {'min / p50':>18}")
    print("\n".join(rows))
    if getattr(native, "U64Map", None) is not None:
        bulk_writes(native, rng, args.repeats)
        if args.growth_keys:
            growth(native, rng, args.growth_keys)


def bulk_writes(native: ModuleType, rng: random.Random, repeats: int, others: int = 3_000_000) -> None:
    """Each call on keys the table does not hold, removed again after it, so its size stays put."""
    table = native.U64Map()
    table.update((rng.getrandbits(64), 1) for _ in range(others))
    salt = rng.getrandbits(64)
    timings: dict[str, list[float]] = {"fill": [], "remap (expiry)": [], "swap_many (salted)": []}
    for _ in range(repeats):
        keys = [rng.getrandbits(64) for _ in range(12_500)]
        started = time.perf_counter()
        table.fill(keys, 2)
        timings["fill"].append(time.perf_counter() - started)
        current = table.get_many(keys)
        started = time.perf_counter()
        native.remap(table, keys, current, {2: None})
        timings["remap (expiry)"].append(time.perf_counter() - started)
        started = time.perf_counter()
        table.swap_many(keys[:6_250], [3] * 6_250, 0, None, 1 << 40, salt, [])
        timings["swap_many (salted)"].append(time.perf_counter() - started)
        salted = [key ^ salt for key in keys[:6_250]]
        native.remap(table, salted, table.get_many(salted), {3: None})
    print(f"\nbulk writes of keys the table lacks ({len(table):,} other keys), ms min / p50")
    for name, samples in timings.items():
        n = "6,250" if name.startswith("swap") else "12,500"
        print(f"{name:>20}  {n:>6} keys  {min(samples) * 1e3:8.3f} / {statistics.median(samples) * 1e3:7.3f}")


def growth(native: ModuleType, rng: random.Random, total: int, step: int = 12_500) -> None:
    """A table filled from empty by ``step``-key calls: the calls that cross a doubling, next to
    the rest."""
    table = native.U64Map()
    samples: list[float] = []
    for _ in range(total // step):
        keys = [rng.getrandbits(64) for _ in range(step)]
        started = time.perf_counter()
        table.fill(keys, 1)
        samples.append(time.perf_counter() - started)
    ranked = sorted(samples)
    worst = sorted(range(len(samples)), key=samples.__getitem__)[-3:][::-1]
    print(f"\ngrowth: {len(table):,} keys by {step:,}-key fill calls, ms")
    print(f"  p50 {statistics.median(samples) * 1e3:.3f}  p99 {ranked[int(len(ranked) * 0.99)] * 1e3:.3f}  "
          f"max {ranked[-1] * 1e3:.3f}  total {sum(samples):.2f} s")  # fmt: skip
    print("  slowest: " + ", ".join(f"{samples[i] * 1e3:.1f} at {(i + 1) * step / 1e6:.2f}M" for i in worst))


if __name__ == "__main__":
    main()
