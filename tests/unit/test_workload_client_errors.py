"""A request whose client raises is a failed request: counted as an error by the progress line
and the table alike, and the user's conversation goes on (no sockets: the client never sends)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import aiohttp

from ppc_extproc_lab.workload.clients import CompletionsClient
from ppc_extproc_lab.workload.generator import Workload, arrivals
from ppc_extproc_lab.workload.report import RequestRecord, summarize
from ppc_extproc_lab.workload.runner import Progress, WorkloadRunner
from ppc_extproc_lab.workload.spec import Stage, WorkloadSpec


class BrokenClient(CompletionsClient):
    """Raises as the chat client does when the ``openai`` package is missing."""

    async def send(
        self, http: aiohttp.ClientSession, url: str, prompt: Any, rec: RequestRecord, now: Callable[[], float]
    ) -> Any | None:
        raise ModuleNotFoundError("No module named 'openai'")


def test_a_raising_client_counts_errors_in_progress_and_table_alike() -> None:
    spec = WorkloadSpec(tenants=2, users_per_tenant=2, context_tokens=64, question_tokens=16, output_tokens=2,
                        turns_per_session=3)  # fmt: skip
    stages = [Stage(200.0, 0.1)]
    schedule = arrivals(spec, stages, max_requests=12)
    seen: list[Progress] = []
    runner = WorkloadRunner(
        Workload(spec), schedule, "http://127.0.0.1:1", schedule_s=0.1, deadline_s=30.0, on_progress=seen.append,
        client=BrokenClient("token-ids", model="mock-model", max_tokens=spec.output_tokens),
    )  # fmt: skip
    result = asyncio.run(runner.run())
    summary = summarize("p", result.records)
    assert summary.scheduled == len(schedule) > 4
    assert (summary.completed, summary.errors, summary.unfinished) == (0, len(schedule), 0)
    last = seen[-1]
    assert (last.sent, last.completed, last.errors, last.in_flight) == (len(schedule), 0, len(schedule), 0)
    assert all(r.error == "ModuleNotFoundError: No module named 'openai'" for r in result.records)
