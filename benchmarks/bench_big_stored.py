"""One 100K-token BlockStored (6,250 blocks at block size 16, as vLLM 0.33 writes it) through
``decode_batch`` and ``EventApplier.apply_batch``, CPU ms per event.

    python benchmarks/bench_big_stored.py                              # the code on the path
    PYTHONPATH=/tmp/base/src python benchmarks/bench_big_stored.py    # another checkout's code

The KV thread's per-block cost of a new prompt's event without the transport around it: 8 events of
distinct random prompts on 4 endpoints into a fresh index, best of 5 passes.
"""

from __future__ import annotations

import gc
import random
import sys
import time
from pathlib import Path

import msgspec

sys.path.insert(0, str(Path(__file__).parent))
from _common import header, pin_to_one_core

import ppc_extproc
from ppc_extproc.blockkeys import TokenProcessor, TokenProcessorConfig
from ppc_extproc.events.apply import EventApplier
from ppc_extproc.events.decode import decode_batch
from ppc_extproc.index import InMemoryIndex

TOKENS = 100_000
BLOCK = 16


def payloads(n: int, rng: random.Random) -> list[bytes]:
    out = []
    blocks = TOKENS // BLOCK
    for r in range(n):
        event = {
            "type": "BlockStored", "block_hashes": list(range(r * 10_000 + 1, r * 10_000 + 1 + blocks)),
            "parent_block_hash": None, "token_ids": [rng.randrange(150_000) for _ in range(TOKENS)],
            "block_size": BLOCK, "lora_id": None, "medium": "GPU", "lora_name": None,
            "extra_keys": [None] * blocks, "group_idx": 0, "kv_cache_spec_kind": "full_attention",
        }  # fmt: skip
        out.append(msgspec.msgpack.encode([time.time(), [event], 0]))
    return out


def main() -> None:
    pin_to_one_core()
    gc.set_threshold(50_000, *gc.get_threshold()[1:])  # as `ppc-extproc serve` does
    header("bench_big_stored: one 100K-token BlockStored, decode and apply")
    print(f"code: {Path(ppc_extproc.__file__).parent.parent}")
    events = payloads(8, random.Random(1))
    decode_ms, total_ms = [], []
    for _ in range(5):
        applier = EventApplier(InMemoryIndex(size=10_000_000), TokenProcessor(TokenProcessorConfig(BLOCK)))
        gc.collect()
        decode = total = 0.0
        for i, payload in enumerate(events):
            start = time.process_time()
            batch = decode_batch(payload)
            mid = time.process_time()
            applier.apply_batch(f"10.0.0.{i % 4}:8000", "m", batch)
            total += time.process_time() - start
            decode += mid - start
        decode_ms.append(decode / len(events) * 1e3)
        total_ms.append(total / len(events) * 1e3)
    print(f"CPU ms per event, best of 5 x {len(events)}: decode {min(decode_ms):.2f}, "
          f"decode + apply {min(total_ms):.2f}")


if __name__ == "__main__":
    main()
