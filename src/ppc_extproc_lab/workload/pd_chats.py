"""Multi-turn chats through a P/D cluster: does a conversation's next turn stay decode-only on the
decode engine that holds it?

Each conversation opens with a long uncached context (disaggregated) and continues with turns that
add the previous answer and a short user message, fewer new tokens than the decider's
``nonCachedTokens``. A router that credits the decode engine with the blocks it received (and
accepts its generated-block events) sees those turns cached there and decides them decode-only; one
that never credits it (llm-d's precise producer: the decode engine announces no transferred block
and its later events have an unknown parent) sends every turn through P/D again.

Requests are token-id completions, streamed with ``return_token_ids`` so the next turn appends the
engine's own answer; each records the serving engine (``x-mock-vllm-endpoint``) and its P/D leg
(``x-mock-vllm-kv-transfer``). Conversations run ``concurrency`` at a time; a conversation's turns
are sequential, ``think_s`` apart.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass

import aiohttp
import orjson

from ppc_extproc_lab.mock_vllm.http import ENDPOINT_HEADER
from ppc_extproc_lab.mock_vllm.kv_transfer import KV_TRANSFER_HEADER
from ppc_extproc_lab.workload.report import percentile

__all__ = ["ChatPlan", "ChatSummary", "TurnRecord", "run_chats", "summarize_chats"]


@dataclass(frozen=True, slots=True)
class ChatPlan:
    """The conversations (token counts) and how they are sent."""

    conversations: int = 8
    turns: int = 4
    context_tokens: int = 1024
    user_tokens: int = 24
    max_tokens: int = 16
    concurrency: int = 4
    think_s: float = 0.0
    seed: int = 0
    model: str = "mock-model"
    timeout_s: float = 60.0

    @property
    def new_tokens_per_turn(self) -> int:
        """Tokens a turn ≥ 2 adds to the conversation: the previous answer and the user's message."""
        return self.max_tokens + self.user_tokens


@dataclass(slots=True)
class TurnRecord:
    conversation: int
    turn: int
    prompt_tokens: int
    new_tokens: int
    endpoint: str | None = None
    #: ``x-mock-vllm-kv-transfer``: "decode" when disaggregated.
    kv_transfer: str | None = None
    cached_tokens: int | None = None
    output_tokens: int = 0
    sent_s: float = 0.0
    first_token_s: float | None = None
    done_s: float | None = None
    error: str | None = None

    @property
    def disaggregated(self) -> bool:
        return self.kv_transfer == "decode"

    @property
    def ok(self) -> bool:
        return self.error is None and self.done_s is not None


async def _turn(http: aiohttp.ClientSession, url: str, plan: ChatPlan, rec: TurnRecord, prompt: list[int],
                t0: float) -> list[int]:
    body = {"model": plan.model, "prompt": prompt, "max_tokens": plan.max_tokens, "stream": True,
            "stream_options": {"include_usage": True}, "return_token_ids": True}
    answer: list[int] = []
    rec.sent_s = time.monotonic() - t0
    try:
        async with http.post(url + "/v1/completions", data=orjson.dumps(body),
                             headers={"content-type": "application/json"}) as resp:
            rec.endpoint = resp.headers.get(ENDPOINT_HEADER)
            rec.kv_transfer = resp.headers.get(KV_TRANSFER_HEADER)
            if resp.status != 200:
                rec.error = f"http {resp.status}: {(await resp.read())[:200]!r}"
                return answer
            async for line in resp.content:
                if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                    continue
                chunk = orjson.loads(line[6:])
                if "error" in chunk:
                    rec.error = str(chunk["error"])[:200]
                    return answer
                for choice in chunk.get("choices") or []:
                    if rec.first_token_s is None:
                        rec.first_token_s = time.monotonic() - t0
                    answer.extend(choice.get("token_ids") or [])
                usage = chunk.get("usage")
                if usage:
                    rec.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
        rec.output_tokens = len(answer)
        rec.done_s = time.monotonic() - t0
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        rec.error = f"{type(exc).__name__}: {exc}"[:200]
    return answer


async def run_chats(url: str, plan: ChatPlan) -> list[TurnRecord]:
    """Run every conversation of ``plan`` against ``url`` (Envoy's listener); one record per turn."""
    rng = random.Random(plan.seed)
    contexts = [[rng.randrange(1, 150_000) for _ in range(plan.context_tokens)] for _ in range(plan.conversations)]
    users = [[[rng.randrange(1, 150_000) for _ in range(plan.user_tokens)] for _ in range(plan.turns)]
             for _ in range(plan.conversations)]
    records: list[TurnRecord] = []
    slots = asyncio.Semaphore(plan.concurrency)
    t0 = time.monotonic()
    timeout = aiohttp.ClientTimeout(total=plan.timeout_s)

    async def conversation(c: int, http: aiohttp.ClientSession) -> None:
        async with slots:
            history = list(contexts[c])
            for t in range(plan.turns):
                prompt = history + users[c][t]
                new = len(prompt) if t == 0 else plan.user_tokens + plan.max_tokens
                rec = TurnRecord(c, t + 1, len(prompt), new)
                records.append(rec)
                answer = await _turn(http, url, plan, rec, prompt, t0)
                if not rec.ok:
                    return
                history = prompt + answer
                if plan.think_s:
                    await asyncio.sleep(plan.think_s)  # the user's think time (part of the workload)

    async with aiohttp.ClientSession(timeout=timeout) as http:
        await asyncio.gather(*(conversation(c, http) for c in range(plan.conversations)))
    return sorted(records, key=lambda r: (r.conversation, r.turn))


@dataclass(frozen=True, slots=True)
class ChatSummary:
    """The follow-up turns (turn ≥ 2 with fewer new tokens than ``nonCachedTokens``) in numbers."""

    label: str
    turns: int
    errors: int
    followups: int
    followups_decode_only: int
    #: Decode-only follow-ups served by the decode engine that served the conversation's previous
    #: turn (the one holding the conversation).
    followups_on_home: int
    disaggregated_total: int
    ttft_p50_s: float
    ttft_p90_s: float
    followup_ttft_p50_s: float
    output_tokens_per_s: float
    hit_rate: float

    @property
    def decode_only_fraction(self) -> float:
        return self.followups_decode_only / self.followups if self.followups else math.nan

    @property
    def on_home_fraction(self) -> float:
        return self.followups_on_home / self.followups if self.followups else math.nan


def summarize_chats(label: str, records: Sequence[TurnRecord], non_cached_tokens: int) -> ChatSummary:
    """Sum up a run of :func:`run_chats`."""
    previous = {(r.conversation, r.turn + 1): r.endpoint for r in records if r.ok}
    done = [r for r in records if r.ok]
    follow = [r for r in done if r.turn >= 2 and r.new_tokens < non_cached_tokens]
    decode_only = [r for r in follow if not r.disaggregated]
    ttft = [r.first_token_s - r.sent_s for r in done if r.first_token_s is not None]
    follow_ttft = [r.first_token_s - r.sent_s for r in follow if r.first_token_s is not None]
    window = max((r.done_s for r in done if r.done_s is not None), default=0.0)
    prompt = sum(r.prompt_tokens for r in done)
    return ChatSummary(
        label=label,
        turns=len(records),
        errors=sum(1 for r in records if not r.ok),
        followups=len(follow),
        followups_decode_only=len(decode_only),
        followups_on_home=sum(1 for r in decode_only if r.endpoint == previous.get((r.conversation, r.turn))),
        disaggregated_total=sum(1 for r in done if r.disaggregated),
        ttft_p50_s=percentile(ttft, 50),
        ttft_p90_s=percentile(ttft, 90),
        followup_ttft_p50_s=percentile(follow_ttft, 50),
        output_tokens_per_s=sum(r.output_tokens for r in done) / window if window > 0 else math.nan,
        hit_rate=sum(r.cached_tokens or 0 for r in done) / prompt if prompt else math.nan,
    )
