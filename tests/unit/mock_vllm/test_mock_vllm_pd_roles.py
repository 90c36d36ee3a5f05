"""The engine's P/D roles (in-memory publisher, no sockets): a prefill leg publishes its prompt and
keeps its block ids; a decode leg skips the prefill lane, pays the transfer time, publishes no
BlockStored for received blocks and parents its generated blocks on the last received hash."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import msgpack
import pytest

from ppc_extproc_lab.mock_vllm.engine import EngineConfig, MockEngine, RequestRejected
from ppc_extproc_lab.mock_vllm.hashing import BlockHasher, wire_hash
from ppc_extproc_lab.mock_vllm.kv_transfer import (
    KvSide,
    RequestLog,
    parse_kv_transfer_params,
    response_params,
)
from ppc_extproc_lab.mock_vllm.publisher import MemoryEventPublisher

T = TypeVar("T")
BS = 16


def run(factory: Callable[[], Awaitable[T]]) -> T:
    async def main() -> T:
        return await asyncio.wait_for(factory(), timeout=10)

    return asyncio.run(main())


def make_engine(**overrides: Any) -> tuple[MockEngine, MemoryEventPublisher]:
    params: dict[str, Any] = {
        "block_size": BS, "num_blocks": 64, "prefill_tokens_per_s": 10_000.0, "decode_ms_per_token": 0.5,
        "kv_transfer_ms_per_token": 0.01,
    }
    params.update(overrides)
    pub = MemoryEventPublisher(topic="kv@10.0.0.5:8000@mock-model")
    return MockEngine(EngineConfig(**params), pub), pub


def stored(pub: MemoryEventPublisher) -> list[dict[str, Any]]:
    out = []
    for _, _, payload in pub.frames:
        out += [e for e in msgpack.unpackb(payload, raw=False)[1] if e["type"] == "BlockStored"]
    return out


PREFILL = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
           "remote_block_ids": None, "remote_host": None, "remote_port": None}


def decode_params(block_ids: list[int]) -> dict[str, Any]:
    return {"do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": block_ids,
            "remote_engine_id": "e-1", "remote_request_id": "r-1", "remote_host": "10.0.0.9",
            "remote_port": 5600, "tp_size": 1}


def test_parse_roles() -> None:
    assert parse_kv_transfer_params(None) is None
    p = parse_kv_transfer_params(PREFILL)
    assert p is not None and p.do_remote_decode and not p.do_remote_prefill and not p.pull_valid
    d = parse_kv_transfer_params(decode_params([1, 2]))
    assert d is not None and d.do_remote_prefill and d.pull_valid and not d.do_remote_decode
    # vLLM pulls only with remote_block_ids and every remote_* field (update_state_after_alloc).
    missing = decode_params([1])
    del missing["remote_request_id"]
    assert not parse_kv_transfer_params(missing).pull_valid  # type: ignore[union-attr]
    assert not parse_kv_transfer_params(decode_params([])).pull_valid  # type: ignore[union-attr]
    with pytest.raises(RequestRejected, match="kv_transfer_params"):
        parse_kv_transfer_params([1])


def test_prefill_leg_publishes_prompt_and_returns_nixl_params() -> None:
    async def scenario() -> None:
        engine, pub = make_engine()
        prompt = list(range(40))
        req = engine.submit(prompt, 1, kv=parse_kv_transfer_params(PREFILL))
        await req.done
        events = stored(pub)
        assert len(events) == 1 and events[0]["token_ids"] == prompt[:32]
        params = response_params(KvSide("eng-p", "10.0.0.9", 5600), req)
        assert params == {
            "do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": req.block_ids,
            "remote_engine_id": "eng-p", "remote_request_id": req.request_id, "remote_host": "10.0.0.9",
            "remote_port": 5600, "tp_size": 1,
        }
        assert len(req.block_ids) == 3  # ceil(40 / 16) blocks of prompt KV
        plain = engine.submit(list(range(100, 120)), 1)
        await plain.done
        assert response_params(KvSide("eng-p", "h", 1), plain) is None
        assert engine.state()["remote_decode_requests"] == 1

    run(scenario)


def test_decode_leg_skips_prefill_and_parents_generated_blocks_on_received_hash() -> None:
    async def scenario() -> None:
        # Prefill so slow that a lane-prefilled request could not finish within the timeout.
        engine, pub = make_engine(prefill_tokens_per_s=1.0)
        prompt = list(range(1000, 1040))  # 2 full blocks + 8 tokens
        req = engine.submit(prompt, 30, kv=parse_kv_transfer_params(decode_params([7, 8, 9])))
        await req.first_token
        assert req.ttft is not None and req.ttft >= 40 * 0.01 / 1000  # transfer time paid
        await req.done
        assert req.transferred_tokens == 40 and req.cached_tokens == 40
        hasher = BlockHasher(BS)
        digests = hasher.hash_blocks(prompt + req.output)
        events = stored(pub)
        # No BlockStored for the 2 received prompt blocks; the generated ones chain on block 2.
        assert all(prompt[:16] != e["token_ids"][:16] for e in events)
        assert events[0]["parent_block_hash"] == wire_hash(digests[1])
        assert [h for e in events for h in e["block_hashes"]] == [wire_hash(d) for d in digests[2:]]
        st = engine.state()
        assert (st["kv_transfers"], st["kv_transfer_tokens"], st["remote_prefill_requests"]) == (1, 40, 1)
        # The received blocks are in the cache: a plain follow-up hits them locally.
        assert engine.match(prompt)[0] == 32

    run(scenario)


def test_decode_leg_transfers_only_what_is_not_cached_and_invalid_params_prefill_locally() -> None:
    async def scenario() -> None:
        engine, pub = make_engine()
        prompt = list(range(2000, 2048))
        warm = engine.submit(prompt[:32], 1)
        await warm.done
        req = engine.submit(prompt, 2, kv=parse_kv_transfer_params(decode_params([1])))
        await req.done
        assert req.transferred_tokens == 48 - 32  # the 2 warm blocks are a local hit
        bad = decode_params([1])
        del bad["remote_host"]
        other = list(range(3000, 3040))
        local = engine.submit(other, 1, kv=parse_kv_transfer_params(bad))
        await local.done
        assert local.transferred_tokens == 0
        assert any(e["token_ids"] == other[:32] for e in stored(pub))  # prefilled and published
        assert engine.state()["kv_transfer_invalid"] == 1

    run(scenario)


def test_request_log_is_bounded_and_reads_generate_sampling_params() -> None:
    log = RequestLog(size=3)
    for i in range(5):
        log.record("/v1/completions", {"x-request-id": f"r{i}"}, {"max_tokens": i, "stream": False})
    assert [e["x_request_id"] for e in log.entries()] == ["r2", "r3", "r4"]
    log.record("/inference/v1/generate", {}, {"sampling_params": {"max_tokens": 1, "min_tokens": 1},
                                               "kv_transfer_params": PREFILL})
    last = log.entries()[-1]
    assert (last["max_tokens"], last["min_tokens"], last["kv_transfer_params"]) == (1, 1, PREFILL)
