"""Drive a schedule of arrivals against a base URL and record every request.

Each user is one task: it waits for its arrival time (and for its own previous turn — the next
prompt needs the answer) and sends its turn through a :class:`~ppc_extproc_lab.workload.clients.
RequestClient` (by default streaming ``/v1/completions`` with token ids), which records the first
token chunk, ``usage`` (prompt and cached tokens) and the ``x-mock-vllm-endpoint`` header. Arrivals
in ``bypass`` skip the target and go straight to the engine named there (outside traffic). The
run ends when every request is done or at ``deadline_s``; what is still open then is recorded as
an error. A failed request's answer is replaced by the mock engine's deterministic answer, so the
following turns stay the same under every policy.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp
import structlog

from ppc_extproc_lab.workload.clients import CompletionsClient, RequestClient, mock_answer
from ppc_extproc_lab.workload.generator import Arrival
from ppc_extproc_lab.workload.report import UNFINISHED, RequestRecord, percentile
from ppc_extproc_lab.workload.spec import WorkloadSpec

__all__ = [
    "Conversations", "FixedTarget", "Progress", "RunResult", "Target", "WorkloadRunner", "mock_answer",
]  # fmt: skip

log = structlog.get_logger(__name__)


class Target(Protocol):
    """Where a request goes: a router's listener, or an engine chosen client-side (the oracle)."""

    async def acquire(self, http: aiohttp.ClientSession, match: Mapping[str, Any]) -> str:
        """Base URL for this request; ``match`` is the prompt's ``/mock/match`` body."""
        ...

    def release(self, url: str) -> None:
        """The request sent to ``url`` finished."""
        ...


@dataclass(frozen=True, slots=True)
class FixedTarget:
    """Every request to one base URL (e.g. ``LocalCluster.listener_url``)."""

    base_url: str

    async def acquire(self, http: aiohttp.ClientSession, match: Mapping[str, Any]) -> str:
        return self.base_url

    def release(self, url: str) -> None:
        return None


class _Conversation(Protocol):
    def prompt(self, arrival: Arrival) -> Any: ...

    def answered(self, prompt: Any, answer: Any) -> None: ...


class Conversations(Protocol):
    """A workload: its spec and one conversation per user (token or text prompts)."""

    @property
    def spec(self) -> WorkloadSpec: ...

    def conversation(self, user: int) -> _Conversation: ...

    def context(self, tenant: int) -> Any:
        """The tenant's shared context (token ids or text)."""
        ...

    def context_prompt(self, tenant: int) -> Any:
        """The tenant's context alone as a prompt (what an engine holding the tenant caches)."""
        ...


@dataclass(frozen=True, slots=True)
class Progress:
    """A snapshot for progress displays."""

    elapsed_s: float
    schedule_s: float
    scheduled: int
    sent: int
    completed: int
    errors: int
    prompt_tokens: int
    cached_tokens: int

    @property
    def in_flight(self) -> int:
        return self.sent - self.completed - self.errors


@dataclass(slots=True)
class RunResult:
    records: list[RequestRecord]
    #: Seconds the schedule spans (the end of the last stage).
    schedule_s: float
    #: Wall seconds from the start to the last request's end (or the deadline).
    wall_s: float
    #: Event-loop oversleep of a 50 ms ticker (p99, max): the generator's own lag.
    loop_lag_p99_s: float = math.nan
    loop_lag_max_s: float = math.nan
    #: p99 of how late requests were sent relative to when they were due.
    send_lag_p99_s: float = math.nan
    deadline_hit: bool = False


class WorkloadRunner:
    """Runs one schedule once; build a new runner for each policy."""

    def __init__(
        self,
        workload: Conversations,
        schedule: Sequence[Arrival],
        target: Target | str,
        *,
        schedule_s: float,
        model: str = "mock-model",
        request_timeout_s: float = 120.0,
        deadline_s: float | None = None,
        max_in_flight: int = 512,
        on_progress: Callable[[Progress], None] | None = None,
        progress_interval_s: float = 0.5,
        client: RequestClient | None = None,
        bypass: Mapping[int, str] | None = None,
    ) -> None:
        self.workload = workload
        self.schedule = list(schedule)
        self.target: Target = FixedTarget(target) if isinstance(target, str) else target
        self.schedule_s = schedule_s
        self.model = model
        self.request_timeout_s = request_timeout_s
        self.deadline_s = deadline_s
        self.max_in_flight = max_in_flight
        self.on_progress = on_progress
        self.progress_interval_s = progress_interval_s
        self.client: RequestClient = client or CompletionsClient(
            "token-ids", model=model, max_tokens=workload.spec.output_tokens
        )
        #: Arrival index → base URL of the engine it goes to, bypassing ``target``.
        self.bypass = dict(bypass or {})
        self.records = [
            RequestRecord(a.index, a.user, a.tenant, a.stage, a.turn, a.at_s, direct=a.index in self.bypass)
            for a in self.schedule
        ]
        self._t0 = 0.0
        self._lags: list[float] = []

    # -- public ------------------------------------------------------------------------------

    async def run(self) -> RunResult:
        loop = asyncio.get_running_loop()
        self._t0 = loop.time()
        by_user: dict[int, list[Arrival]] = {}
        for a in self.schedule:
            by_user.setdefault(a.user, []).append(a)
        timeout = aiohttp.ClientTimeout(total=self.request_timeout_s, sock_connect=10)
        connector = aiohttp.TCPConnector(limit=self.max_in_flight, limit_per_host=0)
        sem = asyncio.Semaphore(self.max_in_flight)
        deadline_hit = False
        async with aiohttp.ClientSession(timeout=timeout, connector=connector, read_bufsize=1 << 20) as http:
            tasks = [
                asyncio.create_task(self._user(http, sem, arrivals), name=f"user-{user}")
                for user, arrivals in by_user.items()
            ]
            ticker = asyncio.create_task(self._ticker())
            try:
                done, pending = await asyncio.wait(tasks, timeout=self.deadline_s) if tasks else (set(), set())
                deadline_hit = bool(pending)
                for task in pending:
                    task.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
                for task in done:
                    if (exc := task.exception()) is not None:
                        log.error("workload_user_task_failed", error=repr(exc))
            finally:
                for task in tasks:
                    task.cancel()
                ticker.cancel()
                await asyncio.gather(*tasks, ticker, return_exceptions=True)
                await self.client.aclose()
        wall = self._now()
        for rec in self.records:
            if rec.error is None and not rec.ok:
                rec.error = "not_sent" if rec.sent_s is None else "deadline"
        self._report_progress()
        send_lags = [r.send_lag_s for r in self.records if r.send_lag_s is not None]
        return RunResult(
            records=self.records,
            schedule_s=self.schedule_s,
            wall_s=wall,
            loop_lag_p99_s=percentile(self._lags, 99),
            loop_lag_max_s=max(self._lags, default=math.nan),
            send_lag_p99_s=percentile(send_lags, 99),
            deadline_hit=deadline_hit,
        )

    def progress(self) -> Progress:
        sent = completed = errors = prompt = cached = 0
        for r in self.records:
            sent += r.sent_s is not None
            if r.ok:
                completed += 1
                prompt += r.prompt_tokens
                cached += r.cached_tokens or 0
            elif r.error is not None and r.error not in UNFINISHED:  # as ``summarize`` counts them
                errors += 1
        return Progress(self._now(), self.schedule_s, len(self.records), sent, completed, errors, prompt, cached)

    # -- internals ---------------------------------------------------------------------------

    def _now(self) -> float:
        return asyncio.get_running_loop().time() - self._t0

    def _report_progress(self) -> None:
        if self.on_progress is not None:
            self.on_progress(self.progress())

    async def _ticker(self) -> None:
        """Measure event-loop lag every 50 ms and report progress on its interval."""
        period, next_report = 0.05, 0.0
        while True:
            before = self._now()
            await asyncio.sleep(period)
            self._lags.append(max(0.0, self._now() - before - period))
            if self._now() >= next_report:
                self._report_progress()
                next_report = self._now() + self.progress_interval_s

    async def _user(self, http: aiohttp.ClientSession, sem: asyncio.Semaphore, arrivals: list[Arrival]) -> None:
        conversation = self.workload.conversation(arrivals[0].user)
        ready_at = 0.0
        for arrival in arrivals:
            due = max(arrival.at_s, ready_at)
            delay = due - self._now()
            if delay > 0:
                await asyncio.sleep(delay)
            rec = self.records[arrival.index]
            prompt = conversation.prompt(arrival)
            rec.prompt_tokens = self.client.prompt_tokens(prompt)
            async with sem:
                rec.send_lag_s = max(0.0, self._now() - due)
                answer = await self._send(http, rec, prompt)
            if answer is None:
                answer = self.client.fallback(prompt)
            conversation.answered(prompt, answer)
            ready_at = self._now()

    async def _send(self, http: aiohttp.ClientSession, rec: RequestRecord, prompt: Any) -> Any | None:
        """Send one request and fill ``rec``; the answer, or None on failure."""
        direct = self.bypass.get(rec.index)
        url = direct if direct is not None else await self.target.acquire(http, self.client.match_body(prompt))
        rec.sent_s = self._now()
        try:
            answer = await self.client.send(http, url, prompt, rec, self._now)
        except asyncio.CancelledError:
            rec.error = rec.error or "deadline"
            raise
        except Exception as exc:  # e.g. a client's missing dependency: this request failed, the user goes on
            rec.error = f"{type(exc).__name__}: {exc}"[:300]
            return None
        finally:
            if direct is None:
                self.target.release(url)
        if answer is None or rec.error is not None:
            return None
        rec.done_s = self._now()
        return answer
