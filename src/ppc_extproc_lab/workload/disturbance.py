"""Disturbances the router does not cause: an engine restart mid-run, and outside traffic.

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

:class:`OutsideTraffic` sends a share of the arrivals straight to the engines, round-robin,
bypassing the router — what batch jobs and other gateways sharing the engines do. Which arrivals
is a pure function of the seed, so every policy sees the same outside requests; the router never
sees them, but the engines cache (and report through their KV events) what they served.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Protocol

import aiohttp
import orjson
import structlog

from ppc_extproc_lab.workload.generator import Arrival
from ppc_extproc_lab.workload.spec import WorkloadSpec

__all__ = ["EngineRestart", "OutsideTraffic", "RestartRecord", "busiest_engine", "tenants_by_engine"]

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


class _Contexts(Protocol):
    @property
    def spec(self) -> WorkloadSpec: ...

    def context(self, tenant: int) -> Any: ...


def _context_body(context: Any) -> dict[str, Any]:
    return {"prompt": context if isinstance(context, str) else list(context)}


async def _matched(http: aiohttp.ClientSession, url: str, body: Mapping[str, Any]) -> int:
    try:
        async with http.post(
            url + "/mock/match",
            data=orjson.dumps(body),
            headers={"content-type": "application/json"},
        ) as resp:
            return int((await resp.json())["matched_tokens"]) if resp.status == 200 else 0
    except (aiohttp.ClientError, TimeoutError, KeyError, ValueError):
        return 0


async def tenants_by_engine(
    http: aiohttp.ClientSession,
    engine_urls: Sequence[str],
    workload: _Contexts,
    context_match: Callable[[int], Mapping[str, Any]] | None = None,
) -> list[list[int]]:
    """Per engine, the tenants whose context it holds the longest cached prefix of (ties: none).

    ``context_match(tenant)`` is the ``/mock/match`` body of the tenant's context in the run's
    request form (default: ``{"prompt": context}``)."""
    bodies = [
        context_match(t) if context_match else _context_body(workload.context(t)) for t in range(workload.spec.tenants)
    ]
    matched = await asyncio.gather(*(_matched(http, u, b) for b in bodies for u in engine_urls))
    n = len(engine_urls)
    held: list[list[int]] = [[] for _ in engine_urls]
    for tenant in range(len(bodies)):
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
    workload: _Contexts,
    *,
    now: Callable[[], float],
    restart_process: Callable[[int], Awaitable[None]],
    context_match: Callable[[int], Mapping[str, Any]] | None = None,
) -> RestartRecord:
    """Wait until ``now() >= restart.at_s``, pick the busiest engine and restart it.

    ``now`` is the run's clock (seconds since its start); ``restart_process(i)`` restarts engine
    ``i``'s process (used in ``process`` mode).
    """
    loop = asyncio.get_running_loop()
    if (delay := restart.at_s - now()) > 0:
        await asyncio.sleep(delay)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
        held = await tenants_by_engine(http, engine_urls, workload, context_match)
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


@dataclass(frozen=True, slots=True)
class OutsideTraffic:
    """Send ``share`` of the arrivals straight to the engines (round-robin), bypassing the router."""

    share: float = 0.3

    def __post_init__(self) -> None:
        if not 0.0 <= self.share <= 1.0:
            raise ValueError("share must be in [0, 1]")

    def plan(self, schedule: Sequence[Arrival], engine_urls: Sequence[str], seed: int) -> dict[int, str]:
        """Arrival index → engine base URL, for the arrivals that bypass the router."""
        if not engine_urls:
            raise ValueError("outside traffic needs at least one engine")
        rng = random.Random(f"{seed}/outside")
        chosen = [a.index for a in schedule if rng.random() < self.share]
        return {index: engine_urls[i % len(engine_urls)] for i, index in enumerate(chosen)}
