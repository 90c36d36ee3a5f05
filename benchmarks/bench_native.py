"""The request path's per-prompt C calls on long prompts (block size 16): the token-array read, and
the key chain plus the index's prefix probe with fresh key objects vs the objects of a recent
prompt (``reuse``: the dict then matches by identity). Best and median of ``--repeats`` calls;
``--native-so PATH`` times another build of ``_native`` (e.g. the code before a change).

    python benchmarks/bench_native.py [--repeats 60] [--native-so /tmp/base/_native.so]
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


def _time(call: Callable[[], object], repeats: int) -> tuple[float, float]:
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        samples.append(time.perf_counter() - started)
    return min(samples) * 1e3, statistics.median(samples) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=60)
    parser.add_argument("--native-so", help="another build of the extension to time")
    args = parser.parse_args()
    header("bench_native: token-array read, key chain + prefix probe (block size 16)")
    native = _load(args.native_so)
    rng = random.Random(1)
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
        print(f"{n_tokens:>7}  {cells}")


if __name__ == "__main__":
    main()
