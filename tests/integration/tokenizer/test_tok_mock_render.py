"""The mock engine with ``--tokenizer``: render, tokenize and chat routes on real sockets.

The mock's render endpoints must return exactly what the local backend computes, in vLLM 0.32's
shapes, and its prefix cache must follow those ids (``cached_tokens``).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import numpy as np
import pytest

from ppc_extproc.tokenizer import LocalTokenizer
from ppc_extproc.tokenizer.render_client import RenderClient, RenderConfig
from ppc_extproc_lab.mock_vllm import MockVllmOptions, serve
from ppc_extproc_lab.mock_vllm.server import MockVllmFleet
from ppc_extproc_lab.tiny_tokenizer import build_tiny_tokenizer

pytestmark = pytest.mark.integration
T = TypeVar("T")
WORDS = ["Hello", " world", " KV", " cache", "<|user|>", "<|use", "|>", " Zürich", " 日本", " 😀", "\n", " tool", "{\"a\": 1}"]


def run(factory: Callable[[], Awaitable[T]], timeout: float = 60) -> T:
    async def main() -> T:
        return await asyncio.wait_for(factory(), timeout)

    return asyncio.run(main())


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_tokenizer(tmp_path_factory.mktemp("tiny"))


@asynccontextmanager
async def mock(tiny: Path) -> AsyncIterator[tuple[MockVllmFleet, str]]:
    opts = MockVllmOptions(port=0, kv_events_endpoint="", model="tiny", tokenizer=str(tiny), prefill_tokens_per_s=1e7, decode_ms_per_token=0.1)
    async with serve(opts) as fleet:
        yield fleet, fleet.engines[0].url


def random_chat(rng: random.Random) -> dict[str, Any]:
    def text() -> str:
        return "".join(rng.choice(WORDS) for _ in range(rng.randint(0, 8)))

    msgs: list[dict[str, Any]] = []
    if rng.random() < 0.5:
        msgs.append({"role": "system", "content": text()})
    for _ in range(rng.randint(1, 3)):
        msgs.append({"role": "user", "content": text() if rng.random() < 0.7 else [{"type": "text", "text": text()}, {"type": "text", "text": text()}]})
        msgs.append({"role": "assistant", "content": text() + "x"})
    body: dict[str, Any] = {"model": "tiny", "messages": msgs, "max_tokens": 2}
    if rng.random() < 0.3:
        body.update(continue_final_message=True, add_generation_prompt=False)
    else:
        msgs.pop()
    if rng.random() < 0.3:
        body["tools"] = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"z": {}, "a": {}}}}}]
    if rng.random() < 0.3:
        body["add_special_tokens"] = True
    return body


def ids(b: bytes) -> list[int]:
    return np.frombuffer(b, dtype="<u4").tolist()


def test_render_routes_match_the_local_backend(tiny: Path) -> None:
    local = LocalTokenizer.from_dir(tiny)

    async def scenario() -> None:
        async with mock(tiny) as (_, url), aiohttp.ClientSession() as http:
            rng = random.Random(7)
            for _ in range(40):
                body = random_chat(rng)
                async with http.post(url + "/v1/chat/completions/render", json=body) as r:
                    assert r.status == 200, await r.text()
                    got = await r.json()
                assert got["request_id"].startswith("chatcmpl-")
                assert got["token_ids"] == ids(local.tokenize("chat", body).prompts[0])
                assert got["features"] is None and got["sampling_params"]["max_tokens"] == 2
                tok_body = {k: v for k, v in body.items() if k not in ("max_tokens",)}
                async with http.post(url + "/tokenize", json=tok_body) as r:
                    t = await r.json()
                assert t["tokens"] == got["token_ids"] and t["count"] == len(got["token_ids"])
            async with http.post(url + "/v1/completions/render", json={"model": "tiny", "prompt": "Hello world", "max_tokens": 4}) as r:
                one = await r.json()
            assert len(one) == 1 and one[0]["request_id"].startswith("cmpl-") and one[0]["token_ids"] == ids(local.encode("Hello world", add_special_tokens=True))
            async with http.post(url + "/v1/completions/render", json={"model": "tiny", "prompt": [[5, 6, 7], [8, 9]], "cache_salt": "s3cr3t"}) as r:
                two = await r.json()
            assert [o["token_ids"] for o in two] == [[5, 6, 7], [8, 9]]
            assert two[0]["request_id"].endswith("-0") and two[1]["request_id"].endswith("-1") and two[0]["cache_salt"] == "s3cr3t"
            async with http.post(url + "/v1/chat/completions/render", json={"model": "nope", "messages": [{"role": "user", "content": "x"}]}) as r:
                err = await r.json()
            assert r.status == 404 and err["error"]["param"] == "model"
            async with http.post(url + "/v1/chat/completions/render", json={"model": "tiny", "messages": [{"role": "user"}, {"content": 1}]}) as r:
                assert r.status == 400 and "messages[1].role" in (await r.json())["error"]["message"]

    run(scenario)


def test_chat_and_messages_hit_the_prefix_cache_on_real_ids(tiny: Path) -> None:
    async def scenario() -> None:
        async with mock(tiny) as (_, url), aiohttp.ClientSession() as http:
            system = "You are a helpful assistant that knows about KV caches. " * 20
            body = {"model": "tiny", "max_tokens": 3, "messages": [{"role": "system", "content": system}, {"role": "user", "content": "first question"}]}
            async with http.post(url + "/v1/chat/completions", json=body) as r:
                first = await r.json()
            assert first["object"] == "chat.completion" and first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
            body["messages"][1]["content"] = "second question"
            async with http.post(url + "/v1/chat/completions", json={**body, "stream": True, "stream_options": {"include_usage": True}}) as r:
                raw = (await r.read()).decode()
            chunks = [line[6:] for line in raw.split("\n") if line.startswith("data: ")]
            assert chunks[-1] == "[DONE]"
            import json

            usage = json.loads(chunks[-2])["usage"]
            assert usage["prompt_tokens_details"]["cached_tokens"] >= 16 * ((first["usage"]["prompt_tokens"] - 8) // 16) - 16
            anthropic = {"model": "tiny", "max_tokens": 2, "system": system, "messages": [{"role": "user", "content": "third"}]}
            async with http.post(url + "/v1/messages", json=anthropic) as r:
                msg = await r.json()
            assert msg["type"] == "message" and msg["usage"]["cache_read_input_tokens"] > 0
            async with http.post(url + "/v1/completions", json={"model": "tiny", "prompt": system, "max_tokens": 1}) as r:
                assert (await r.json())["usage"]["prompt_tokens"] < len(system)  # real tokens, not bytes

    run(scenario)


def test_render_client_against_the_mock(tiny: Path) -> None:
    local = LocalTokenizer.from_dir(tiny)

    async def scenario() -> None:
        async with mock(tiny) as (_, url), RenderClient(RenderConfig(model_name="tiny", url=url + "/")) as client:
            body = {"model": "my-lora", "messages": [{"role": "user", "content": "Hello world"}], "tools": [{"type": "function", "function": {"name": "f", "parameters": {"z": 1, "a": 2}}}]}
            res = await client.render("chat", body)
            assert res.ok and res.prompts == local.tokenize("chat", body).prompts
            comp = await client.render("completions", {"model": "x", "prompt": ["Hello", "world"], "cache_salt": "s"})
            assert comp.ok and len(comp.prompts) == 2 and comp.cache_salt == "s"
            passthrough = await client.render("completions", {"prompt": [1, 2, 3]})
            assert ids(passthrough.prompts[0]) == [1, 2, 3]
            msgs = {"model": "x", "max_tokens": 2, "system": "S", "messages": [{"role": "user", "content": "hi"}]}
            res_m = await client.render("messages", msgs)  # the mock lacks /v1/messages/render: chat fallback
            assert res_m.ok and not client.messages_route
            assert res_m.prompts == local.tokenize("messages", msgs).prompts
            bad = await client.render("chat", {"messages": [{"role": "user"}, {}]})
            assert bad.reason == "http_400" and bad.detail.startswith("vLLM render returned status 400")

    run(scenario)
