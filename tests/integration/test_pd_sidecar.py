"""The P/D sidecar in front of a decode mock, two prefill mocks, over real sockets (no router):
the legs as llm-d's routing sidecar sends them, what each engine received, the client's usage, and
what a failed prefill gives the client."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import aiohttp
import orjson
import pytest
from aiohttp import web

from ppc_extproc_lab.mock_vllm.server import MockVllmOptions, RunningEngine, serve
from ppc_extproc_lab.pd_sidecar import PREFILL_HEADER, SidecarOptions, create_sidecar_app

pytestmark = pytest.mark.integration

T = TypeVar("T")
PREFILL_PARAMS = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                  "remote_block_ids": None, "remote_host": None, "remote_port": None}


def run(factory: Callable[[], Awaitable[T]], timeout: float = 60) -> T:
    async def main() -> T:
        return await asyncio.wait_for(factory(), timeout)

    return asyncio.run(main())


@dataclass
class Lab:
    prefill: list[RunningEngine]
    decode: RunningEngine
    sidecar_url: str
    http: aiohttp.ClientSession

    async def requests(self, engine: RunningEngine) -> list[dict[str, Any]]:
        async with self.http.get(f"{engine.url}/mock/requests") as r:
            out: list[dict[str, Any]] = await r.json()
            return out

    async def state(self, engine: RunningEngine) -> dict[str, Any]:
        async with self.http.get(f"{engine.url}/mock/state") as r:
            out: dict[str, Any] = await r.json()
            return out


@asynccontextmanager
async def lab(**sidecar: Any) -> AsyncIterator[Lab]:
    opts = MockVllmOptions(port=0, count=3, kv_events_endpoint="", num_blocks=512,
                           prefill_tokens_per_s=200_000.0, decode_ms_per_token=0.5)
    async with serve(opts) as fleet, aiohttp.ClientSession() as http:
        *prefill, decode = fleet.engines
        runner = web.AppRunner(create_sidecar_app(SidecarOptions(decoder_url=decode.url, **sidecar)))
        await runner.setup()
        try:
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            port = runner.addresses[0][1]
            yield Lab(prefill, decode, f"http://127.0.0.1:{port}", http)
        finally:
            await runner.cleanup()


PROMPT = list(range(5000, 5100))  # 100 tokens: 6 full blocks


def test_nixlv2_legs_params_and_cached_tokens_reach_the_client() -> None:
    async def scenario() -> None:
        async with lab() as L:
            p0 = L.prefill[0]
            # Warm the prefiller with the first 64 tokens: its leg then reports cached tokens.
            async with L.http.post(f"{p0.url}/v1/completions", json={"prompt": PROMPT[:64], "max_tokens": 1}) as r:
                assert r.status == 200
            body = {"prompt": PROMPT, "max_tokens": 20, "min_tokens": 2, "stream": False}
            async with L.http.post(f"{L.sidecar_url}/v1/completions", json=body,
                                   headers={PREFILL_HEADER: p0.endpoint}) as r:
                assert r.status == 200, await r.text()
                assert r.headers["x-mock-vllm-endpoint"] == L.decode.endpoint
                assert r.headers["x-mock-vllm-kv-transfer"] == "decode"
                out = await r.json()
            prefill_leg = (await L.requests(p0))[-1]
            assert prefill_leg["max_tokens"] == 1 and prefill_leg["min_tokens"] == 1
            assert prefill_leg["stream"] is False and not prefill_leg["has_stream_options"]
            assert prefill_leg["kv_transfer_params"] == PREFILL_PARAMS
            decode_leg = (await L.requests(L.decode))[-1]
            assert decode_leg["max_tokens"] == 20 and decode_leg["min_tokens"] == 2
            kv = decode_leg["kv_transfer_params"]
            assert kv["do_remote_prefill"] is True and kv["do_remote_decode"] is False
            assert kv["remote_host"] == p0.endpoint.rpartition(":")[0] and kv["remote_port"] == 5600
            assert len(kv["remote_block_ids"]) == 7 and kv["tp_size"] == 1
            assert set(kv) >= {"remote_engine_id", "remote_request_id"}
            # One x-request-id names both legs.
            assert prefill_leg["x_request_id"] and prefill_leg["x_request_id"] == decode_leg["x_request_id"]
            # The decoder received the prompt (transfer, no prefill) and its usage was rewritten.
            st = await L.state(L.decode)
            assert (st["kv_transfers"], st["kv_transfer_tokens"]) == (1, 100)
            assert out["usage"]["prompt_tokens_details"]["cached_tokens"] == 64  # the prefiller's
            assert len(out["choices"][0]["text"]) > 0 and out["usage"]["completion_tokens"] == 20
            assert (await L.state(L.prefill[1]))["requests_total"] == 0

    run(scenario)


def test_streaming_decode_usage_rewritten_and_first_candidate_used() -> None:
    async def scenario() -> None:
        async with lab() as L:
            body = {"prompt": PROMPT, "max_tokens": 8, "stream": True, "stream_options": {"include_usage": True}}
            header = f"{L.prefill[1].endpoint}, {L.prefill[0].endpoint}"
            async with L.http.post(f"{L.sidecar_url}/v1/completions", json=body,
                                   headers={PREFILL_HEADER: header}) as r:
                assert r.status == 200 and r.headers["Content-Type"].startswith("text/event-stream")
                raw = await r.read()
            frames = [line[6:] for line in raw.split(b"\n") if line.startswith(b"data: ")]
            assert frames[-1] == b"[DONE]"
            usage = orjson.loads(frames[-2])["usage"]
            assert usage["prompt_tokens_details"]["cached_tokens"] == 0  # prefiller's; decoder said 100
            assert len(frames) == 8 + 2
            assert (await L.state(L.prefill[1]))["remote_decode_requests"] == 1
            assert (await L.state(L.prefill[0]))["requests_total"] == 0
            decode_leg = (await L.requests(L.decode))[-1]
            assert decode_leg["stream"] is True and decode_leg["has_stream_options"]

    run(scenario)


def test_generate_api_limits_live_in_sampling_params() -> None:
    async def scenario() -> None:
        async with lab() as L:
            body = {"token_ids": PROMPT, "sampling_params": {"max_tokens": 5}}
            async with L.http.post(f"{L.sidecar_url}/inference/v1/generate", json=body,
                                   headers={PREFILL_HEADER: L.prefill[0].endpoint}) as r:
                assert r.status == 200, await r.text()
                assert len((await r.json())["choices"][0]["token_ids"]) == 5
            prefill_leg = (await L.requests(L.prefill[0]))[-1]
            assert (prefill_leg["max_tokens"], prefill_leg["min_tokens"]) == (1, 1)
            decode_leg = (await L.requests(L.decode))[-1]
            assert decode_leg["max_tokens"] == 5 and "min_tokens" not in decode_leg

    run(scenario)


def test_without_header_the_decoder_gets_the_request_unchanged() -> None:
    async def scenario() -> None:
        async with lab() as L:
            async with L.http.post(f"{L.sidecar_url}/v1/completions", json={"prompt": PROMPT, "max_tokens": 3}) as r:
                assert r.status == 200
                assert r.headers["x-mock-vllm-endpoint"] == L.decode.endpoint
                assert "x-mock-vllm-kv-transfer" not in r.headers
            leg = (await L.requests(L.decode))[-1]
            assert leg["kv_transfer_params"] is None and leg["x_request_id"] is None and leg["max_tokens"] == 3
            assert [(await L.state(p))["requests_total"] for p in L.prefill] == [0, 0]
            async with L.http.get(f"{L.sidecar_url}/v1/models") as r:  # other paths: proxied
                assert r.status == 200 and r.headers["x-mock-vllm-endpoint"] == L.decode.endpoint

    run(scenario)


def _dead_endpoint() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def test_prefill_errors_are_the_clients_answer_and_only_5xx_transients_retry() -> None:
    async def scenario() -> None:
        async with lab(prefill_max_retries=2, prefill_retry_backoff_s=0.01) as L:
            url = f"{L.sidecar_url}/v1/completions"
            body = {"prompt": PROMPT, "max_tokens": 4}
            async with L.http.post(url, json=body, headers={PREFILL_HEADER: _dead_endpoint()}) as r:
                assert r.status == 502 and await r.read() == b""  # Go's reverse proxy: 502, no body
            p0 = L.prefill[0]
            async with L.http.post(f"{p0.url}/mock/faults", json={"completions_status": 503}) as r:
                assert r.status == 200
            async with L.http.post(url, json=body, headers={PREFILL_HEADER: p0.endpoint}) as r:
                assert r.status == 503
                assert (await r.json())["error"]["message"] == "injected by POST /mock/faults"
            async with L.http.get(f"{L.sidecar_url}/sidecar/state") as r:
                st = await r.json()
            assert st["prefill_retries"] >= 2 + 2 and st["prefill_errors"] == 2
            # A 400 from the prefiller is not retried and never reaches the decoder.
            async with L.http.post(f"{p0.url}/mock/faults", json={"completions_status": None}) as r:
                assert r.status == 200
            bad = {"prompt": PROMPT, "max_tokens": 4, "model": "other-model"}
            async with L.http.post(url, json=bad, headers={PREFILL_HEADER: p0.endpoint}) as r:
                assert r.status == 404
            assert (await L.state(L.decode))["requests_total"] == 0
            async with L.http.post(url, data=b"{not json", headers={PREFILL_HEADER: p0.endpoint}) as r:
                assert r.status == 400 and (await r.json())["type"] == "BadRequestError"

    run(scenario)


def test_shared_storage_prefills_one_token_then_decodes_plainly() -> None:
    async def scenario() -> None:
        async with lab(kv_connector="shared-storage") as L:
            body = {"prompt": PROMPT, "max_tokens": 6}
            async with L.http.post(f"{L.sidecar_url}/v1/completions", json=body,
                                   headers={PREFILL_HEADER: L.prefill[0].endpoint}) as r:
                assert r.status == 200
                assert (await r.json())["usage"]["completion_tokens"] == 6
            prefill_leg = (await L.requests(L.prefill[0]))[-1]
            assert (prefill_leg["max_tokens"], prefill_leg["max_completion_tokens"]) == (1, 1)
            assert prefill_leg["kv_transfer_params"] is None and prefill_leg["x_request_id"] is None
            assert prefill_leg["cache_hit_threshold"] == 0 and prefill_leg["stream"] is None
            decode_leg = (await L.requests(L.decode))[-1]
            assert decode_leg["max_tokens"] == 6 and decode_leg["kv_transfer_params"] is None
            assert decode_leg["cache_hit_threshold"] == 0
            assert (await L.state(L.decode))["kv_transfers"] == 0

    run(scenario)


@pytest.mark.parametrize("connector", ["nixlv2", "shared-storage"])
def test_local_fallback_decodes_the_clients_request_when_the_prefill_leg_fails(connector: str) -> None:
    """``prefill_fallback="local"``: an unreachable prefiller or a 5xx (after the retries) is
    replaced by local prefill of the client's own request, named in ``x-prefill-fallback``; a 4xx
    is still the client's answer."""

    async def scenario() -> None:
        async with lab(kv_connector=connector, prefill_fallback="local", prefill_retry_backoff_s=0.0) as L:
            url = f"{L.sidecar_url}/v1/completions"
            body = {"prompt": PROMPT, "max_tokens": 4}
            async with L.http.post(url, json=body, headers={PREFILL_HEADER: _dead_endpoint(), "x-request-id": "a"}) as r:
                assert r.status == 200 and r.headers["x-prefill-fallback"] == "unreachable"
                assert r.headers["x-mock-vllm-endpoint"] == L.decode.endpoint
                assert (await r.json())["usage"]["completion_tokens"] == 4
            leg = (await L.requests(L.decode))[-1]
            # The client's request as sent: no transfer to wait for, the engine prefills it.
            assert leg["kv_transfer_params"] is None and leg["max_tokens"] == 4 and leg["x_request_id"] == "a"
            assert (await L.state(L.decode))["kv_transfers"] == 0

            p0 = L.prefill[0]
            async with L.http.post(f"{p0.url}/mock/faults", json={"completions_status": 503}) as r:
                assert r.status == 200
            async with L.http.post(url, json=body, headers={PREFILL_HEADER: p0.endpoint}) as r:
                assert r.status == 200 and r.headers["x-prefill-fallback"] == "status-503"
            async with L.http.post(f"{p0.url}/mock/faults", json={"completions_status": None}) as r:
                assert r.status == 200
            bad = {"prompt": PROMPT, "max_tokens": 4, "model": "other-model"}
            async with L.http.post(url, json=bad, headers={PREFILL_HEADER: p0.endpoint}) as r:
                assert r.status == 404 and "x-prefill-fallback" not in r.headers
            # A healthy prefiller is still used.
            async with L.http.post(url, json=body, headers={PREFILL_HEADER: p0.endpoint}) as r:
                assert r.status == 200 and "x-prefill-fallback" not in r.headers
            async with L.http.get(f"{L.sidecar_url}/sidecar/state") as r:
                st = await r.json()
            assert st["prefill_fallbacks"] == 2 and st["prefill_errors"] == 3
            async with L.http.get(f"{L.sidecar_url}/sidecar/requests") as r:
                log = await r.json()
            assert [e["fallback"] for e in log] == ["unreachable", "status-503", None, None]

    run(scenario)


def test_prefill_fallback_flag_is_checked() -> None:
    with pytest.raises(ValueError, match="prefill_fallback must be one of none, local"):
        SidecarOptions(decoder_url="http://127.0.0.1:1", prefill_fallback="remote")
