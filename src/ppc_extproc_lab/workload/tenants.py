"""Tenants for the overload lab: several clients at unequal Poisson rates in priority bands, each
request naming its tenant (``x-llm-d-inference-fairness-id``) and objective
(``x-llm-d-inference-objective``, which the router maps to a priority band).

    tenants = [Tenant("interactive", "interactive", 0, rate=1.0),
               Tenant("batch-a", "batch", -1, rate=6.0), Tenant("batch-b", "batch", -1, rate=3.0)]
    records = await run_tenants("http://127.0.0.1:8080", tenants, duration_s=30, model="m")
    jain_index(uncached_service(records, band=-1).values())

Prompts are distinct seeded token ids (no shared prefixes: every prompt token is uncached work), so
a tenant's uncached-token service is the prompt tokens of its answered requests. Every request is
streamed and recorded: status, time to first token, the drop reason header of a rejection, the
serving engine.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import aiohttp
import numpy as np
import orjson

from ppc_extproc_lab.mock_vllm.http import ENDPOINT_HEADER
from ppc_extproc_lab.mock_vllm.request import MAX_TOKEN_ID

__all__ = [
    "DROPPED_REASON_HEADER",
    "FAIRNESS_HEADER",
    "OBJECTIVE_HEADER",
    "Tenant",
    "TenantRecord",
    "jain_index",
    "run_tenants",
    "tenant_arrivals",
    "uncached_service",
]

FAIRNESS_HEADER = "x-llm-d-inference-fairness-id"
OBJECTIVE_HEADER = "x-llm-d-inference-objective"
DROPPED_REASON_HEADER = "x-llm-d-request-dropped-reason"


@dataclass(frozen=True, slots=True)
class Tenant:
    """One client population: its fairness id, objective (→ band) and request shape."""

    name: str
    objective: str
    #: The band its objective maps to (for reports; the router decides from the objective).
    priority: int
    #: Poisson arrivals per second.
    rate: float
    prompt_tokens: int = 256
    max_tokens: int = 32


@dataclass(slots=True)
class TenantRecord:
    tenant: str
    priority: int
    sent_at: float
    prompt_tokens: int
    status: int = 0
    first_token_at: float | None = None
    done_at: float | None = None
    cached_tokens: int = 0
    dropped_reason: str | None = None
    endpoint: str | None = None
    error: str | None = None

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_at is None else self.first_token_at - self.sent_at

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None and self.done_at is not None

    @property
    def uncached_tokens(self) -> int:
        return max(0, self.prompt_tokens - self.cached_tokens)


def tenant_arrivals(
    tenants: Sequence[Tenant], duration_s: float, seed: int = 0
) -> list[tuple[float, Tenant, list[int]]]:
    """(offset, tenant, prompt) of every request, sorted by offset: Poisson per tenant, seeded."""
    rng = np.random.default_rng(seed)
    out: list[tuple[float, Tenant, list[int]]] = []
    for tenant in tenants:
        t = float(rng.exponential(1.0 / tenant.rate)) if tenant.rate > 0 else duration_s
        while t < duration_s:
            prompt = rng.integers(1, MAX_TOKEN_ID, tenant.prompt_tokens).tolist()
            out.append((t, tenant, prompt))
            t += float(rng.exponential(1.0 / tenant.rate))
    out.sort(key=lambda a: a[0])
    return out


async def _send(
    http: aiohttp.ClientSession, url: str, model: str, tenant: Tenant, prompt: list[int], rec: TenantRecord
) -> None:
    body = {"model": model, "prompt": prompt, "max_tokens": tenant.max_tokens, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    headers = {"content-type": "application/json", FAIRNESS_HEADER: tenant.name, OBJECTIVE_HEADER: tenant.objective}
    try:
        async with http.post(url + "/v1/completions", data=orjson.dumps(body), headers=headers) as resp:
            rec.status = resp.status
            rec.endpoint = resp.headers.get(ENDPOINT_HEADER)
            rec.dropped_reason = resp.headers.get(DROPPED_REASON_HEADER)
            if resp.status != 200:
                rec.error = f"http {resp.status}: {(await resp.read())[:200].decode('utf-8', 'replace')}"
                return
            async for raw in resp.content:
                if not raw.startswith(b"data: "):
                    continue
                data = raw[6:].strip()
                if data == b"[DONE]":
                    rec.done_at = time.monotonic()
                    break
                chunk = orjson.loads(data)
                if chunk.get("choices") and rec.first_token_at is None:
                    rec.first_token_at = time.monotonic()
                usage = chunk.get("usage") or {}
                rec.cached_tokens = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        rec.error = f"{type(exc).__name__}: {exc}"[:200]


async def run_tenants(
    url: str,
    tenants: Sequence[Tenant],
    duration_s: float,
    *,
    model: str,
    seed: int = 0,
    timeout_s: float = 120.0,
    max_connections: int = 2000,
) -> list[TenantRecord]:
    """Send every tenant's arrivals to ``url`` on schedule (open loop); one record per request,
    in arrival order, once every request has ended or timed out."""
    schedule = tenant_arrivals(tenants, duration_s, seed)
    records: list[TenantRecord] = []
    tasks: list[asyncio.Task[None]] = []
    connector = aiohttp.TCPConnector(limit=max_connections, force_close=False)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        start = time.monotonic()
        for offset, tenant, prompt in schedule:
            delay = start + offset - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            rec = TenantRecord(tenant.name, tenant.priority, time.monotonic(), len(prompt))
            records.append(rec)
            tasks.append(asyncio.create_task(_send(http, url, model, tenant, prompt, rec)))
        await asyncio.gather(*tasks)
    return records


def uncached_service(
    records: Iterable[TenantRecord], band: int | None = None, until: float | None = None
) -> dict[str, int]:
    """Uncached prompt tokens served per tenant, optionally of one band: answered requests, or
    (``until``, a monotonic time) requests prefilled by then — the service while tenants contend,
    not the backlog served after arrivals stop."""
    out: dict[str, int] = {}
    for rec in records:
        if band is not None and rec.priority != band:
            continue
        out.setdefault(rec.tenant, 0)
        served = rec.ok if until is None else rec.first_token_at is not None and rec.first_token_at <= until
        if served:
            out[rec.tenant] += rec.uncached_tokens
    return out


def jain_index(values: Iterable[float]) -> float:
    """Jain's fairness index ``(Σx)² / (n·Σx²)``: 1 for equal shares, 1/n when one takes all."""
    xs = [float(v) for v in values]
    total_sq = sum(x * x for x in xs)
    if not xs or total_sq == 0:
        return 1.0
    return sum(xs) ** 2 / (len(xs) * total_sq)
