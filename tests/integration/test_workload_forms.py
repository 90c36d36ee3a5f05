"""The text workload in every request form against in-process mock engines (no router): the
engines see the same tokens whichever form carries them (UTF-8 bytes, or the engines'
``--tokenizer``), the oracle matches chat prompts in the engine's own ids, outside traffic goes
where it was planned, and the chat client reads an OpenAI stream."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from ppc_extproc.tokenizer import LocalTokenizer
from ppc_extproc_lab.localcluster import free_port
from ppc_extproc_lab.mock_vllm.server import MockVllmOptions, serve
from ppc_extproc_lab.tiny_tokenizer import build_tiny_tokenizer
from ppc_extproc_lab.workload.clients import ChatClient, EngineTokens, RequestClient, client_for
from ppc_extproc_lab.workload.disturbance import OutsideTraffic
from ppc_extproc_lab.workload.generator import arrivals
from ppc_extproc_lab.workload.oracle import OracleTarget
from ppc_extproc_lab.workload.report import RequestRecord, summarize
from ppc_extproc_lab.workload.runner import RunResult, WorkloadRunner
from ppc_extproc_lab.workload.spec import Stage, WorkloadSpec
from ppc_extproc_lab.workload.text import TextPrompt, TextWorkload, chars_per_token

pytestmark = pytest.mark.integration

SPEC = WorkloadSpec(tenants=2, users_per_tenant=2, context_tokens=256, question_tokens=32, output_tokens=8,
                    turns_per_session=3, seed=3)  # fmt: skip
ENGINES = MockVllmOptions(port=0, kv_events_endpoint="", block_size=16, num_blocks=512,
                          prefill_tokens_per_s=100_000.0, decode_ms_per_token=2.0, count=2)  # fmt: skip
STAGES = [Stage(30, 1.0)]


def run(
    client: RequestClient, *, oracle: bool = False, outside: float | None = None, tokenizer: str | None = None
) -> tuple[RunResult, list[str]]:
    async def scenario() -> tuple[RunResult, list[str]]:
        async with serve(replace(ENGINES, tokenizer=tokenizer)) as fleet:
            urls = [e.url for e in fleet.engines]
            schedule = arrivals(SPEC, STAGES)
            bypass = OutsideTraffic(outside).plan(schedule, urls, seed=SPEC.seed) if outside else None
            scale = chars_per_token(client.tokens.text) if tokenizer else 1.0  # type: ignore[attr-defined]
            target = OracleTarget(urls, seed=1) if oracle else urls[0]
            runner = WorkloadRunner(
                TextWorkload(SPEC, chars_per_token=scale), schedule, target,
                schedule_s=1.0, deadline_s=30, client=client, bypass=bypass,
            )  # fmt: skip
            result = await runner.run()
            if isinstance(target, OracleTarget):
                assert target.routed and target.unanswered == 0  # every engine matched every prompt
            return result, [e.endpoint for e in fleet.engines]

    return asyncio.run(asyncio.wait_for(scenario(), 60))


def completions(form: str, tokens: EngineTokens | None = None) -> RequestClient:
    return client_for(form, model="mock-model", max_tokens=SPEC.output_tokens, tokens=tokens)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(build_tiny_tokenizer(tmp_path_factory.mktemp("tiny")))


def test_text_and_its_token_ids_are_the_same_requests_to_the_engine() -> None:
    by_form = {form: run(completions(form))[0].records for form in ("text", "tokens")}
    for form, records in by_form.items():
        assert all(r.ok for r in records), (form, [r.error for r in records if not r.ok])
    text, tokens = by_form["text"], by_form["tokens"]
    assert [r.prompt_tokens for r in text] == [r.prompt_tokens for r in tokens]
    assert [r.cached_tokens for r in text] == [r.cached_tokens for r in tokens]
    # Turns after the first hit the previous turn: its prompt and the (re-sent) answer text.
    later = [r for r in text if r.turn > 0]
    assert later and all((r.cached_tokens or 0) >= SPEC.context_tokens for r in later)


def test_with_a_tokenizer_every_form_reaches_the_engine_as_its_own_ids(tiny: str) -> None:
    tokens = EngineTokens(LocalTokenizer.from_dir(tiny))
    by_form = {form: run(completions(form, tokens), tokenizer=tiny)[0].records for form in ("text", "tokens")}
    chat = run(ChatClient(model="mock-model", max_tokens=SPEC.output_tokens, tokens=tokens), tokenizer=tiny)[0].records
    for form, records in [*by_form.items(), ("chat", chat)]:
        assert all(r.ok for r in records), (form, [r.error for r in records if not r.ok])
    assert [r.prompt_tokens for r in by_form["text"]] == [r.prompt_tokens for r in by_form["tokens"]]
    assert [r.cached_tokens for r in by_form["text"]] == [r.cached_tokens for r in by_form["tokens"]]
    # The context is ~256 tokens whatever the form: the text was scaled to the tokenizer.
    assert all(200 < r.prompt_tokens < 600 for r in chat)
    later = [r for r in chat if r.turn > 0]
    assert later and all((r.cached_tokens or 0) >= 192 for r in later)


def test_the_oracle_matches_chat_prompts_in_the_engines_ids(tiny: str) -> None:
    tokens = EngineTokens(LocalTokenizer.from_dir(tiny))
    result, _ = run(ChatClient(model="mock-model", max_tokens=SPEC.output_tokens, tokens=tokens),
                    oracle=True, tokenizer=tiny)  # fmt: skip
    records = [r for r in result.records if r.ok]
    assert len(records) == len(result.records)
    assert summarize("oracle", records).hit_rate > 0.5


def test_the_oracle_matches_text_prompts() -> None:
    result, endpoints = run(completions("text"), oracle=True)
    records = [r for r in result.records if r.ok]
    assert len(records) == len(result.records)
    assert {r.endpoint for r in records} <= set(endpoints)
    assert summarize("oracle", records).hit_rate > 0.5


def test_outside_traffic_goes_to_the_planned_engine_and_is_marked() -> None:
    result, endpoints = run(completions("text"), outside=0.5)
    direct = [r for r in result.records if r.direct]
    routed = [r for r in result.records if not r.direct]
    assert direct and routed and all(r.ok for r in result.records)
    assert {r.endpoint for r in routed} == {endpoints[0]}  # the target: engine 0
    assert {r.endpoint for r in direct} == set(endpoints)  # round-robin over both


async def _fake_chat_server(chunks: list[dict[str, Any]], status: int = 200) -> tuple[web.AppRunner, str]:
    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
        assert body["messages"][0]["role"] == "system"
        if status != 200:
            return web.json_response({"error": {"message": "nope"}}, status=status, headers={"x-mock-vllm-endpoint": "e:1"})
        resp = web.StreamResponse(headers={"content-type": "text/event-stream", "x-mock-vllm-endpoint": "e:1"})
        await resp.prepare(request)
        for c in chunks:
            await resp.write(b"data: " + orjson.dumps(c) + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}"


def _chunk(content: str | None, usage: dict[str, Any] | None = None) -> dict[str, Any]:
    choices = [] if content is None else [{"index": 0, "delta": {"role": "assistant", "content": content},
                                           "finish_reason": None}]  # fmt: skip
    return {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": choices, "usage": usage}


def test_chat_client_reads_the_stream_usage_and_endpoint() -> None:
    usage = {"prompt_tokens": 40, "completion_tokens": 2, "total_tokens": 42, "prompt_tokens_details": {"cached_tokens": 32}}
    prompt = TextPrompt(0, "ctx", (), "q")

    async def main(status: int) -> tuple[Any, RequestRecord]:
        runner, url = await _fake_chat_server([_chunk("he"), _chunk("llo"), _chunk(None, usage)], status)
        client = ChatClient(model="m", max_tokens=2)
        rec = RequestRecord(0, user=0, tenant=0, stage=0, turn=0, scheduled_s=0.0)
        clock = iter(range(1, 100))
        try:
            async with aiohttp.ClientSession() as http:
                answer = await client.send(http, url, prompt, rec, lambda: float(next(clock)))
        finally:
            await client.aclose()
            await runner.cleanup()
        return answer, rec

    answer, rec = asyncio.run(main(200))
    assert answer == "hello"
    assert (rec.status, rec.endpoint, rec.first_token_s) == (200, "e:1", 1.0)
    assert (rec.prompt_tokens, rec.cached_tokens, rec.output_tokens) == (40, 32, 2) and rec.error is None
    answer, rec = asyncio.run(main(404))
    assert answer is None and rec.status == 404 and rec.endpoint == "e:1" and rec.error and "404" in rec.error


def test_chat_against_todays_mock_fails_cleanly() -> None:
    result, _ = run(ChatClient(model="mock-model", max_tokens=SPEC.output_tokens))
    # Until the mock serves /v1/chat/completions every request is a recorded 404, and the
    # conversations go on with the engine's deterministic answers.
    assert result.records and all(r.status == 404 and r.error and not r.ok for r in result.records)
