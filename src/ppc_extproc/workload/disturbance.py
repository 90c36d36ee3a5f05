"""Disturbances the router does not cause: an engine restart in the middle of a run.

:class:`EngineRestart` restarts, ``at_s`` seconds into the schedule, the engine that holds the
most tenants at that moment — the one whose loss hurts most. "Holds" is measured, not guessed:
every engine is asked ``POST /mock/match`` for every tenant's shared context (no side effects), and
a tenant counts for the engine that has the longest cached prefix of its context (ties: none).
Two ways to restart:

``mock``     ``POST /mock/restart``: in-flight requests fail, the cache is dropped, the KV-event
             seq goes back to 0 and the replay buffer is emptied, with no downtime — the cache
             loss alone, as the router sees it;
``process``  stop the engine process and start it again on the same address (what a pod restart
             is): requests routed to it meanwhile fail as well. The run's CPU meter keeps
             watching the old pid, so the restarted engine's CPU after the restart is not counted.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import aiohttp
import orjson
import structlog

from ppc_extproc.workload.generator import Workload

__all__ = ["EngineRestart", "RestartRecord", "busiest_engine", "tenants_by_engine"]

log = structlog.get_logger(__name__)

RestartMode = Literal["mock", "process"]


@dataclass(frozen=True, slots=True)
class EngineRestart:
    """Restart the engine holding the most tenants ``at_s`` seconds into the run."""

    at_s: float
    mode: RestartMode = "mock"

    def __post_init__(self) -> None:
        if self.at_s < 0:
            raise ValueError("at_s must be >= 0")
        if self.mode not in ("mock", "process"):
            raise ValueError(f"unknown restart mode {self.mode!r}")


@dataclass(slots=True)
class RestartRecord:
    """What a restart did (for the report)."""

    at_s: float
    mode: str
    engine: int
    #: ``ip:port`` of the restarted engine (as in ``RequestRecord.endpoint``).
    endpoint: str
    #: Tenants whose context that engine held (by tenant index) just before the restart.
    tenants: list[int] = field(default_factory=list)
    #: Tenants held by each engine just before the restart (engine order).
    tenants_per_engine: list[int] = field(default_factory=list)
    #: Seconds the restart took (request, or process stop + start until healthy).
    took_s: float = 0.0
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


async def _matched(http: aiohttp.ClientSession, url: str, prompt: Sequence[int]) -> int:
    try:
        async with http.post(
            url + "/mock/match",
            data=orjson.dumps({"prompt": list(prompt)}),
            headers={"content-type": "application/json"},
        ) as resp:
            return int((await resp.json())["matched_tokens"]) if resp.status == 200 else 0
    except (aiohttp.ClientError, TimeoutError, KeyError, ValueError):
        return 0


async def tenants_by_engine(
    http: aiohttp.ClientSession, engine_urls: Sequence[str], workload: Workload
) -> list[list[int]]:
    """Per engine, the tenants whose context it holds the longest cached prefix of (ties: none)."""
    contexts = [workload.context(t) for t in range(workload.spec.tenants)]
    matched = await asyncio.gather(*(_matched(http, u, c) for c in contexts for u in engine_urls))
    n = len(engine_urls)
    held: list[list[int]] = [[] for _ in engine_urls]
    for tenant in range(len(contexts)):
        row = matched[tenant * n : (tenant + 1) * n]
        best = max(row)
        if best > 0 and row.count(best) == 1:
            held[row.index(best)].append(tenant)
    return held


def busiest_engine(held: Sequence[Sequence[int]]) -> int:
    """Index of the engine holding the most tenants (lowest index on ties)."""
    counts = [len(h) for h in held]
    return counts.index(max(counts))


async def run_restart(
    restart: EngineRestart,
    engine_urls: Sequence[str],
    workload: Workload,
    *,
    now: Callable[[], float],
    restart_process: Callable[[int], Awaitable[None]],
) -> RestartRecord:
    """Wait until ``now() >= restart.at_s``, pick the busiest engine and restart it.

    ``now`` is the run's clock (seconds since its start); ``restart_process(i)`` restarts engine
    ``i``'s process (used in ``process`` mode).
    """
    loop = asyncio.get_running_loop()
    if (delay := restart.at_s - now()) > 0:
        await asyncio.sleep(delay)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
        held = await tenants_by_engine(http, engine_urls, workload)
        index = busiest_engine(held)
        record = RestartRecord(
            at_s=round(now(), 3), mode=restart.mode, engine=index,
            endpoint=engine_urls[index].removeprefix("http://"),
            tenants=list(held[index]), tenants_per_engine=[len(h) for h in held],
        )  # fmt: skip
        started = loop.time()
        try:
            if restart.mode == "mock":
                async with http.post(engine_urls[index] + "/mock/restart") as resp:
                    if resp.status != 200:
                        record.error = f"http {resp.status}"
            else:
                await restart_process(index)
        except Exception as exc:  # a failed restart is reported, the run goes on
            record.error = f"{type(exc).__name__}: {exc}"
        record.took_s = round(loop.time() - started, 3)
    log.info("engine_restarted", **record.as_dict())
    return record
