"""The mock vLLM end to end over real sockets: HTTP, ZMQ PUB/SUB and ROUTER/DEALER replay.

Engines run in-process on ephemeral ports (HTTP port 0, ``tcp://127.0.0.1:0`` for ZMQ).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any, TypeVar

import aiohttp
import msgpack
import orjson
import pytest
import zmq
import zmq.asyncio

from ppc_extproc_lab.mock_vllm.server import MockVllmOptions, RunningEngine, serve

pytestmark = pytest.mark.integration

T = TypeVar("T")
H0, H1, H1_PRIME = 0x137BB037547F4CAF, 0x16D077AD0843C577, 0xD2D19D6B02AABFEF
END = b"\xff" * 8
BASE = MockVllmOptions(
    port=0,
    kv_events_endpoint="tcp://127.0.0.1:0",
    num_blocks=256,
    prefill_tokens_per_s=200_000.0,
    decode_ms_per_token=1.0,
)
_unique = itertools.count(10_000)


def run(factory: Callable[[], Awaitable[T]], timeout: float = 30) -> T:
    async def main() -> T:
        return await asyncio.wait_for(factory(), timeout)

    return asyncio.run(main())


def unique_prompt(n: int = 16) -> list[int]:
    start = next(_unique) * 64
    return list(range(start, start + n))


class Subscriber:
    """A zmq SUB socket on one engine's PUB endpoint, decoding frames."""

    def __init__(self, ctx: zmq.asyncio.Context, endpoint: str) -> None:
        self.sock = ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SUBSCRIBE, b"kv@")
        self.sock.connect(endpoint)

    async def recv(self, timeout: float = 5.0) -> tuple[bytes, int, bytes]:
        frames = await asyncio.wait_for(self.sock.recv_multipart(), timeout)
        assert len(frames) == 3 and len(frames[1]) == 8
        return frames[0], int.from_bytes(frames[1], "big"), frames[2]

    async def ready(self, http: aiohttp.ClientSession, engine: RunningEngine) -> None:
        """Make sure the subscription is live, then restart the engine so seq starts at 0."""
        deadline = time.monotonic() + 10
        while True:
            await complete(http, engine, unique_prompt(), max_tokens=1)
            if await self.sock.poll(200):
                break
            assert time.monotonic() < deadline, "subscription never became live"
        _, seq, _ = await self.recv()
        async with http.get(f"{engine.url}/mock/state") as r:
            published = (await r.json())["seq"]
        while seq < published - 1:
            _, seq, _ = await self.recv()
        async with http.post(f"{engine.url}/mock/restart") as r:
            assert r.status == 200 and (await r.json())["seq"] == 0

    def close(self) -> None:
        self.sock.close(linger=0)


@asynccontextmanager
async def fleet(
    **overrides: Any,
) -> AsyncIterator[tuple[list[RunningEngine], aiohttp.ClientSession]]:
    async with serve(replace(BASE, **overrides)) as f, aiohttp.ClientSession() as http:
        yield f.engines, http


async def complete(
    http: aiohttp.ClientSession, engine: RunningEngine, prompt: Any, **extra: Any
) -> dict[str, Any]:
    async with http.post(f"{engine.url}/v1/completions", json={"prompt": prompt, **extra}) as r:
        assert r.status == 200, await r.text()
        assert r.headers["x-mock-vllm-endpoint"] == engine.endpoint
        body: dict[str, Any] = await r.json()
        return body


@pytest.mark.parametrize("encoding", ["map", "array", "map16"])
def test_live_events_frames_and_decoded_forms(encoding: str) -> None:
    async def scenario() -> None:
        ctx = zmq.asyncio.Context()
        async with fleet(event_encoding=encoding) as (engines, http):
            (eng,) = engines
            assert eng.kv_events_endpoint is not None
            sub = Subscriber(ctx, eng.kv_events_endpoint)
            try:
                await sub.ready(http, eng)
                await complete(http, eng, list(range(1, 33)), max_tokens=1)
                await complete(http, eng, list(range(1, 17)) + list(range(101, 117)), max_tokens=1)
                async with http.post(f"{eng.url}/reset_prefix_cache") as r:
                    assert r.status == 200
                got = [await sub.recv() for _ in range(3)]
            finally:
                sub.close()
        ctx.term()
        topic = f"kv@{eng.endpoint}@mock-model".encode()
        assert [(t, s) for t, s, _ in got] == [(topic, 0), (topic, 1), (topic, 2)]
        batches = [msgpack.unpackb(payload, raw=False) for _, _, payload in got]
        assert all(len(b) == 3 and b[2] == 0 and isinstance(b[0], float) for b in batches)
        first, second, third = (b[1] for b in batches)
        if encoding == "array":
            assert first == [
                [
                    "BlockStored", [H0, H1], None, list(range(1, 33)), 16, None, "GPU", None,
                    [None, None], 0, "full_attention", None,
                ]
            ]  # fmt: skip
            assert second[0][1:3] == [[H1_PRIME], H0]
            assert third == [["AllBlocksCleared"]]
        else:
            assert first == [
                {
                    "type": "BlockStored",
                    "block_hashes": [H0, H1],
                    "parent_block_hash": None,
                    "token_ids": list(range(1, 33)),
                    "block_size": 16,
                    "lora_id": None,
                    "medium": "GPU",
                    "lora_name": None,
                    "extra_keys": [None, None],
                    "group_idx": 0,
                    "kv_cache_spec_kind": "full_attention",
                }
            ]
            assert second[0]["block_hashes"] == [H1_PRIME]
            assert second[0]["parent_block_hash"] == H0
            assert third == [{"type": "AllBlocksCleared"}]
        map_header = got[0][2][11:14]
        if encoding == "map":
            assert map_header[:1] == b"\x8b"
        elif encoding == "map16":
            assert map_header == b"\xde\x00\x0b"

    run(scenario)


@pytest.mark.parametrize("replay_format", ["new", "old"])
def test_replay_with_dealer(replay_format: str) -> None:
    async def scenario() -> None:
        ctx = zmq.asyncio.Context()
        async with fleet(
            replay_endpoint="tcp://127.0.0.1:0", buffer_steps=4, replay_format=replay_format
        ) as (engines, http):
            (eng,) = engines
            assert eng.replay_endpoint is not None
            for _ in range(6):
                await complete(http, eng, unique_prompt(), max_tokens=1)
            dealer = ctx.socket(zmq.DEALER)
            dealer.setsockopt(zmq.LINGER, 0)
            dealer.connect(eng.replay_endpoint)
            try:
                # Invalid (wrong frame count): no reply, so the first reply answers the valid one.
                await dealer.send_multipart([b"", b"\x00" * 8, b"extra"])
                await dealer.send_multipart([b"", (0).to_bytes(8, "big")])
                replies = []
                while True:
                    frames = await asyncio.wait_for(dealer.recv_multipart(), 5)
                    replies.append(frames)
                    if END in frames:
                        break
                await dealer.send_multipart([b"", (4).to_bytes(8, "big")])
                partial = [await asyncio.wait_for(dealer.recv_multipart(), 5) for _ in range(3)]
            finally:
                dealer.close(linger=0)
        ctx.term()
        topic = f"kv@{eng.endpoint}@mock-model".encode()
        *data, end = replies
        if replay_format == "new":
            assert end == [b"", b"", END, b""]
            assert [f[1] for f in data] == [topic] * 4
            seqs = [int.from_bytes(f[2], "big") for f in data]
            payloads = [f[3] for f in data]
        else:
            assert end == [b"", END, b""]
            assert all(len(f) == 3 for f in data)
            seqs = [int.from_bytes(f[1], "big") for f in data]
            payloads = [f[2] for f in data]
        assert seqs == [2, 3, 4, 5]  # only the last buffer_steps batches are retained
        for payload in payloads:
            (event,) = msgpack.unpackb(payload, raw=False)[1]
            assert event["type"] == "BlockStored"
        # A later start returns only the newer batches, then the end marker.
        assert [int.from_bytes(f[-2], "big") for f in partial[:2]] == [4, 5]
        assert partial[-1][-2] == END and partial[-1][-1] == b""

    run(scenario)


async def _sse_events(resp: aiohttp.ClientResponse) -> AsyncIterator[tuple[float, bytes]]:
    buf = b""
    async for chunk in resp.content.iter_any():
        buf += chunk
        while b"\n\n" in buf:
            line, buf = buf.split(b"\n\n", 1)
            assert line.startswith(b"data: ")
            yield time.monotonic(), line[len(b"data: ") :]


def test_streaming_completions_and_generate() -> None:
    async def scenario() -> None:
        async with fleet() as (engines, http):
            (eng,) = engines
            prompt = unique_prompt(40)
            body = {
                "prompt": prompt,
                "max_tokens": 5,
                "stream": True,
                "stream_options": {"include_usage": True},
                "return_token_ids": True,
            }
            async with http.post(f"{eng.url}/v1/completions", json=body) as r:
                assert r.status == 200 and r.content_type == "text/event-stream"
                assert r.headers["x-mock-vllm-endpoint"] == eng.endpoint
                raw = [data async for _, data in _sse_events(r)]
            assert raw[-1] == b"[DONE]"
            chunks = [orjson.loads(d) for d in raw[:-1]]
            token_chunks, usage_chunk = chunks[:-1], chunks[-1]
            assert len(token_chunks) == 5
            assert [c["choices"][0]["finish_reason"] for c in token_chunks] == [None] * 4 + [
                "length"
            ]
            assert token_chunks[0]["choices"][0]["prompt_token_ids"] == prompt
            streamed = [c["choices"][0]["token_ids"][0] for c in token_chunks]
            assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] == 5
            assert usage_chunk["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
            # Non-streaming answer of the same prompt is identical (deterministic outputs).
            again = await complete(http, eng, prompt, max_tokens=5, return_token_ids=True)
            assert again["choices"][0]["token_ids"] == streamed
            assert again["usage"]["prompt_tokens_details"] == {"cached_tokens": 32}
            gen = {"token_ids": prompt, "sampling_params": {"max_tokens": 5}, "stream": True}
            async with http.post(f"{eng.url}/inference/v1/generate", json=gen) as r:
                raw = [data async for _, data in _sse_events(r)]
            assert raw[-1] == b"[DONE]"
            tokens = [orjson.loads(d)["choices"][0]["token_ids"][0] for d in raw[:-1]]
            assert tokens == streamed

    run(scenario)


def test_cached_second_request_has_lower_ttft() -> None:
    async def scenario() -> None:
        async with fleet(prefill_tokens_per_s=4_000.0) as (engines, http):
            (eng,) = engines
            prompt = unique_prompt(400)  # 100 ms of prefill uncached, 4 ms when cached
            ttfts, cached = [], []
            for _ in range(2):
                body = {
                    "prompt": prompt,
                    "max_tokens": 3,
                    "stream": True,
                    "stream_options": {"include_usage": True},
                }
                start = time.monotonic()
                async with http.post(f"{eng.url}/v1/completions", json=body) as r:
                    events = [e async for e in _sse_events(r)]
                ttfts.append(events[0][0] - start)
                cached.append(orjson.loads(events[-2][1])["usage"]["prompt_tokens_details"])
            assert cached == [{"cached_tokens": 0}, {"cached_tokens": (400 - 1) // 16 * 16}]
            assert ttfts[1] < ttfts[0]

    run(scenario)


def test_http_surface_and_errors() -> None:
    async def scenario() -> None:
        async with fleet(num_blocks=8) as (engines, http):
            (eng,) = engines
            async with http.get(f"{eng.url}/health") as r:
                assert r.status == 200 and await r.read() == b""
                assert r.headers["x-mock-vllm-endpoint"] == eng.endpoint
            async with http.get(f"{eng.url}/v1/models") as r:
                assert (await r.json())["data"][0]["id"] == "mock-model"
            async with http.get(f"{eng.url}/version") as r:
                assert (await r.json())["version"] == "0.28.0"
            async with http.get(f"{eng.url}/kv_event_sources") as r:
                src = (await r.json())["0"]
                assert src["endpoint"] == eng.kv_events_endpoint and src["topic"] == eng.topic
            batch = await complete(http, eng, [[1, 2, 3], [4, 5, 6, 7]], max_tokens=2)
            assert [c["index"] for c in batch["choices"]] == [0, 1]
            assert batch["usage"]["prompt_tokens"] == 7 and batch["usage"]["completion_tokens"] == 4
            text = await complete(http, eng, "hello", max_tokens=3)
            assert text["usage"]["prompt_tokens"] == 5 and len(text["choices"][0]["text"]) == 3
            gen = {"token_ids": list(range(40)), "sampling_params": {"max_tokens": 2}}
            async with http.post(f"{eng.url}/inference/v1/generate", json=gen) as r:
                body = await r.json()
                assert body["request_id"].startswith("generate-tokens-")
                assert len(body["choices"][0]["token_ids"]) == 2
            async with http.post(f"{eng.url}/mock/match", json={"prompt": list(range(40))}) as r:
                assert await r.json() == {
                    "cached_tokens": 32,
                    "matched_tokens": 32,
                    "block_size": 16,
                }
            async with http.get(f"{eng.url}/metrics") as r:
                metrics = await r.text()
            assert (
                'vllm:cache_config_info{block_size="16",enable_prefix_caching="True",engine="0",'
                'model_name="mock-model",num_gpu_blocks="8"} 1.0' in metrics
            )
            assert 'vllm:num_requests_running{engine="0",model_name="mock-model"} 0.0' in metrics
            assert (
                'vllm:prefix_cache_queries_total{engine="0",model_name="mock-model"} 52.0'
                in metrics
            )
            assert (
                "vllm:kv_cache_usage_perc{" in metrics and "vllm:num_requests_waiting{" in metrics
            )
            async with http.get(f"{eng.url}/mock/state") as r:
                state = await r.json()
            assert state["requests_finished"] == 4 and state["blocks_used"] == 0
            for payload, status, err_type in [
                (b"{not json", 400, "BadRequestError"),
                (orjson.dumps({"model": "nope", "prompt": [1]}), 404, "NotFoundError"),
                (
                    orjson.dumps({"prompt": list(range(200)), "max_tokens": 1}),
                    400,
                    "BadRequestError",
                ),
                (orjson.dumps({"prompt": [-1]}), 400, "BadRequestError"),
            ]:
                async with http.post(f"{eng.url}/v1/completions", data=payload) as r:
                    assert r.status == status
                    assert r.headers["x-mock-vllm-endpoint"] == eng.endpoint
                    err = (await r.json())["error"]
                    assert (
                        err["type"] == err_type and err["code"] == status and err["param"] is None
                    )

    run(scenario)


def test_reset_prefix_cache_conflicts_while_a_request_runs() -> None:
    async def scenario() -> None:
        async with fleet(decode_ms_per_token=2.0) as (engines, http):
            (eng,) = engines
            body = {"prompt": unique_prompt(32), "max_tokens": 100, "stream": True}
            async with http.post(f"{eng.url}/v1/completions", json=body) as stream:
                events = _sse_events(stream)
                await events.__anext__()  # the request is running
                async with http.post(f"{eng.url}/reset_prefix_cache") as r:
                    assert r.status == 409
                    assert (await r.json())["error"]["code"] == 409
                async for _ in events:
                    pass
            async with http.post(f"{eng.url}/reset_prefix_cache") as r:
                assert r.status == 200

    run(scenario)


def test_two_engines_in_one_process() -> None:
    async def scenario() -> None:
        async with fleet(count=2) as (engines, http):
            a, b = engines
            assert a.endpoint != b.endpoint and a.topic != b.topic
            assert a.kv_events_endpoint != b.kv_events_endpoint
            prompt = unique_prompt(48)
            await complete(http, a, prompt, max_tokens=1)
            await complete(http, b, prompt, max_tokens=1)  # b has its own cache: a miss
            for eng, expected in ((a, 32), (b, 32)):
                async with http.post(f"{eng.url}/mock/match", json={"prompt": prompt}) as r:
                    assert (await r.json())["cached_tokens"] == expected
            await complete(http, a, unique_prompt(16), max_tokens=1)
            async with http.get(f"{a.url}/mock/state") as r:
                assert (await r.json())["seq"] == 2
            async with http.get(f"{b.url}/mock/state") as r:
                assert (await r.json())["seq"] == 1

    run(scenario)


def test_client_disconnect_aborts_the_stream_and_frees_blocks() -> None:
    async def scenario() -> None:
        async with fleet(decode_ms_per_token=2.0) as (engines, http):
            (eng,) = engines
            body = {"prompt": unique_prompt(40), "max_tokens": 2000, "stream": True}
            resp = await http.post(f"{eng.url}/v1/completions", json=body)
            await resp.content.readline()  # first token arrived: the request is running
            resp.close()  # drop the connection mid-stream

            async def state() -> dict[str, Any]:
                async with http.get(f"{eng.url}/mock/state") as r:
                    result: dict[str, Any] = await r.json()
                    return result

            deadline = time.monotonic() + 5
            while (s := await state())["requests_aborted"] != 1:
                assert time.monotonic() < deadline, s
                await asyncio.sleep(0.01)
            assert s["blocks_used"] == 0 and s["requests_running"] == 0

    run(scenario)


def test_cache_salt_over_http() -> None:
    async def scenario() -> None:
        async with fleet() as (engines, http):
            (eng,) = engines
            prompt = unique_prompt(33)
            first = await complete(http, eng, prompt, max_tokens=1, cache_salt="s3cr3t")
            assert first["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
            unsalted = await complete(http, eng, prompt, max_tokens=1)
            assert unsalted["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
            salted = await complete(http, eng, prompt, max_tokens=1, cache_salt="s3cr3t")
            assert salted["usage"]["prompt_tokens_details"] == {"cached_tokens": 32}
            match = {"prompt": prompt, "cache_salt": "other"}
            async with http.post(f"{eng.url}/mock/match", json=match) as r:
                assert (await r.json())["cached_tokens"] == 0

    run(scenario)
