"""The engine's scheduler, time model and published batches (in-memory publisher, no sockets)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import msgpack
import pytest

from ppc_extproc_lab.mock_vllm.engine import (
    EngineAborted,
    EngineConfig,
    MockEngine,
    RequestRejected,
    output_tokens,
)
from ppc_extproc_lab.mock_vllm.hashing import BlockHasher, wire_hash
from ppc_extproc_lab.mock_vllm.publisher import MemoryEventPublisher

T = TypeVar("T")


def run(factory: Callable[[], Awaitable[T]]) -> T:
    async def main() -> T:
        return await asyncio.wait_for(factory(), timeout=10)

    return asyncio.run(main())


def make_engine(**overrides: Any) -> tuple[MockEngine, MemoryEventPublisher]:
    params: dict[str, Any] = {
        "block_size": 16,
        "num_blocks": 64,
        "prefill_tokens_per_s": 200_000.0,
        "decode_ms_per_token": 0.5,
    }
    params.update(overrides)
    pub = MemoryEventPublisher(topic="kv@10.0.0.5:8000@mock-model")
    return MockEngine(EngineConfig(**params), pub), pub


def batches(pub: MemoryEventPublisher) -> list[tuple[int, list[Any]]]:
    """``(seq, decoded events)`` per published message."""
    out = []
    for topic, seq8, payload in pub.frames:
        assert topic == b"kv@10.0.0.5:8000@mock-model"
        batch = msgpack.unpackb(payload, raw=False)
        assert len(batch) == 3 and batch[2] == 0
        out.append((int.from_bytes(seq8, "big"), batch[1]))
    return out


def test_vllm_pinned_behaviour_prompt_range_32_max_tokens_1() -> None:
    # tests/v1/engine/test_engine_core_client.py::test_kv_cache_events
    async def scenario() -> None:
        engine, pub = make_engine()
        req = engine.submit(list(range(32)), max_tokens=1)
        await req.done
        ((seq, events),) = batches(pub)
        assert seq == 0
        (event,) = events
        assert event["type"] == "BlockStored" and len(event["block_hashes"]) == 2
        assert event["block_size"] == 16 and event["parent_block_hash"] is None
        assert event["lora_id"] is None and event["lora_name"] is None
        assert event["token_ids"] == list(range(32))

    run(scenario)


def test_second_identical_request_hits_cache_and_has_lower_ttft() -> None:
    async def scenario() -> None:
        engine, _ = make_engine(prefill_tokens_per_s=20_000.0)
        prompt = list(range(1, 401))
        first = engine.submit(prompt, max_tokens=4)
        await first.done
        second = engine.submit(prompt, max_tokens=4)
        await second.done
        assert first.cached_tokens == 0
        assert second.cached_tokens == (len(prompt) - 1) // 16 * 16
        assert first.ttft is not None and second.ttft is not None
        assert second.ttft < first.ttft

    run(scenario)


def test_concurrent_identical_prompts_hit_blocks_of_the_prefill_ahead() -> None:
    async def scenario() -> None:
        engine, _ = make_engine(prefill_tokens_per_s=20_000.0)
        prompt = list(range(1, 401))
        a = engine.submit(prompt, max_tokens=2)
        b = engine.submit(prompt, max_tokens=2)
        await asyncio.gather(a.done, b.done)
        assert a.cached_tokens == 0 and b.cached_tokens == 384
        assert a.first_token_at is not None and b.first_token_at is not None
        assert b.prefill_start == pytest.approx(a.first_token_at)  # serial lane
        assert b.first_token_at - a.first_token_at == pytest.approx(16 / 20_000.0)

    run(scenario)


def test_prefill_lane_is_serial_and_fifo() -> None:
    async def scenario() -> None:
        engine, _ = make_engine(prefill_tokens_per_s=50_000.0)
        reqs = [
            engine.submit(list(range(i * 1000, i * 1000 + 500)), max_tokens=2) for i in range(3)
        ]
        await asyncio.gather(*(r.done for r in reqs))
        starts = [r.prefill_start for r in reqs]
        firsts = [r.first_token_at for r in reqs]
        assert all(s is not None for s in starts) and all(f is not None for f in firsts)
        assert firsts[0] <= starts[1] and firsts[1] <= starts[2]  # type: ignore[operator]
        assert reqs[0].ttft < reqs[1].ttft < reqs[2].ttft  # type: ignore[operator]

    run(scenario)


def test_max_num_seqs_makes_requests_wait() -> None:
    async def scenario() -> None:
        engine, _ = make_engine(max_num_seqs=1)
        a = engine.submit([1, 2, 3], max_tokens=20)
        b = engine.submit([4, 5, 6], max_tokens=2)
        await asyncio.sleep(0)
        assert engine.num_running == 1 and engine.num_waiting == 1
        await b.done
        assert a.finished_at is not None and b.prefill_start is not None
        assert b.prefill_start >= a.finished_at

    run(scenario)


def test_decode_tokens_are_spaced_by_decode_step() -> None:
    async def scenario() -> None:
        engine, _ = make_engine(decode_ms_per_token=2.0)
        req = engine.submit([1, 2, 3], max_tokens=5)
        await req.done
        times = [req.token_time(i) for i in range(1, 6)]
        gaps = [b - a for a, b in itertools.pairwise(times[1:])]
        assert all(g == pytest.approx(0.002) for g in gaps)
        assert 0 < times[1] - times[0] <= 0.002 + 1e-9
        assert req.finished_at == pytest.approx(times[-1])

    run(scenario)


def test_generated_tokens_fill_blocks_that_are_stored_and_multi_turn_hits_them() -> None:
    async def scenario() -> None:
        engine, pub = make_engine()
        prompt = list(range(1, 21))  # 20 tokens: 1 full block + 4
        req = engine.submit(prompt, max_tokens=30)  # KV for 20 + 29 = 49 tokens ⇒ 3 full blocks
        await req.done
        stored = [e for _, evs in batches(pub) for e in evs if e["type"] == "BlockStored"]
        assert [len(e["block_hashes"]) for e in stored] == [1, 1, 1]
        full = [*prompt, *req.output]
        expected = [wire_hash(d) for d in BlockHasher(16).hash_blocks(full[:48])]
        assert [e["block_hashes"][0] for e in stored] == expected
        assert [e["parent_block_hash"] for e in stored] == [None, expected[0], expected[1]]
        assert stored[1]["token_ids"] == full[16:32]
        # Turn 2 appends the answer: the cache covers prompt + generated blocks.
        turn2 = engine.submit([*full, 7, 8, 9], max_tokens=1)
        await turn2.done
        assert turn2.cached_tokens == 48

    run(scenario)


def test_outputs_are_deterministic_per_prompt_and_seed() -> None:
    assert output_tokens([1, 2, 3], 8) == output_tokens([1, 2, 3], 8)
    assert output_tokens([1, 2, 3], 8) != output_tokens([1, 2, 4], 8)
    assert output_tokens([1, 2, 3], 8, seed=1) != output_tokens([1, 2, 3], 8)
    assert all(32 <= t < 127 for t in output_tokens(list(range(50)), 200))


def test_eviction_batch_lists_removals_before_the_store() -> None:
    async def scenario() -> None:
        engine, pub = make_engine(num_blocks=2)
        await engine.submit(list(range(32)), max_tokens=1).done
        await engine.submit(list(range(100, 132)), max_tokens=1).done
        (_, first), (_, second) = batches(pub)
        assert [e["type"] for e in second] == ["BlockRemoved", "BlockRemoved", "BlockStored"]
        evicted = {e["block_hashes"][0] for e in second[:2]}
        assert evicted == set(first[0]["block_hashes"])

    run(scenario)


def test_sequence_numbers_are_contiguous_from_zero() -> None:
    async def scenario() -> None:
        engine, pub = make_engine()
        for i in range(4):
            await engine.submit(list(range(i * 100, i * 100 + 16)), max_tokens=1).done
        assert [seq for seq, _ in batches(pub)] == [0, 1, 2, 3]

    run(scenario)


def test_request_that_can_never_fit_is_rejected() -> None:
    async def scenario() -> None:
        engine, _ = make_engine(num_blocks=2)
        with pytest.raises(RequestRejected, match="KV-cache blocks"):
            engine.submit(list(range(30)), max_tokens=10)
        with pytest.raises(RequestRejected):
            engine.submit([], max_tokens=1)
        with pytest.raises(RequestRejected):
            engine.submit([1, -1], max_tokens=1)
        with pytest.raises(RequestRejected):
            engine.submit([1], max_tokens=0)
        assert engine.counters.requests_rejected == 1

    run(scenario)


def test_reset_prefix_cache_refused_while_running_then_emits_all_blocks_cleared() -> None:
    async def scenario() -> None:
        engine, pub = make_engine(decode_ms_per_token=1.0)
        req = engine.submit(list(range(40)), max_tokens=50)
        await req.first_token
        assert engine.reset_prefix_cache() is False
        await req.done
        assert engine.reset_prefix_cache() is True
        _, events = batches(pub)[-1]
        assert events == [{"type": "AllBlocksCleared"}]
        assert engine.match(list(range(40))) == (0, 0)

    run(scenario)


def test_restart_resets_seq_and_cache_without_all_blocks_cleared_and_aborts_requests() -> None:
    async def scenario() -> None:
        engine, pub = make_engine(decode_ms_per_token=1.0)
        await engine.submit(list(range(32)), max_tokens=1).done
        inflight = engine.submit(list(range(100, 140)), max_tokens=500)
        await inflight.first_token
        n_before = len(pub.frames)
        engine.restart()
        with pytest.raises(EngineAborted):
            await inflight.done
        assert pub.next_seq == 0 and pub.retained() == []
        assert len(pub.frames) == n_before  # nothing published by the restart itself
        assert engine.match(list(range(32))) == (0, 0)
        assert engine.state()["blocks_used"] == 0
        await engine.submit(list(range(32)), max_tokens=1).done
        seq, events = batches(pub)[-1]
        assert seq == 0 and events[0]["type"] == "BlockStored"

    run(scenario)


def test_abort_releases_blocks_and_lets_the_next_request_run() -> None:
    async def scenario() -> None:
        engine, _ = make_engine(max_num_seqs=1, decode_ms_per_token=1.0)
        a = engine.submit(list(range(20)), max_tokens=1000)
        b = engine.submit(list(range(50, 70)), max_tokens=1)
        await a.first_token
        engine.abort(a, "client disconnected")
        await b.done
        assert engine.state()["blocks_used"] == 0
        assert engine.counters.requests_aborted == 1

    run(scenario)


def test_match_has_no_side_effects() -> None:
    async def scenario() -> None:
        engine, pub = make_engine()
        await engine.submit(list(range(64)), max_tokens=1).done
        n = len(pub.frames)
        assert engine.match(list(range(64))) == (48, 64)
        assert engine.match(list(range(64)) + [1]) == (64, 64)
        assert len(pub.frames) == n and engine.counters.prefix_cache_queries == 64

    run(scenario)
