"""``coldPlacement: rendezvous`` and ``traceSize`` on a real Valkey: replicas place a prompt no
endpoint holds on one endpoint without a round trip, write its claim in the background (so a
claiming replica adopts it), wait for the claim when some endpoint holds part of the prompt, route
on the local pick while the store is gone; the trace logs own and peer counts with monotonic stamps."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import syncer_helpers
from syncer_helpers import stopped, until

from ppc_extproc.framework import Endpoint, SchedulingContext, SchedulingResult
from ppc_extproc.plugins.datalayer.redis_syncer import RedisSyncer
from ppc_extproc.plugins.registry import Services
from ppc_extproc.scheduling.inflight import InflightTracker
from ppc_extproc.scheduling.rendezvous import rendezvous
from ppc_extproc_lab.valkey import ValkeyServer

pytestmark = pytest.mark.integration

ENDPOINTS = [Endpoint(f"10.0.0.{i}", 8000) for i in range(1, 5)]
IDS = [e.id for e in ENDPOINTS]


def syncer(server: ValkeyServer, **params: Any) -> RedisSyncer:
    return syncer_helpers.syncer(server, Services(inflight=InflightTracker()), **params)


async def started(*plugins: RedisSyncer) -> None:
    await syncer_helpers.started(*plugins, peers=True)


def routed(keys: list[int], pick: Endpoint, known: dict[Endpoint, int] | None = None) -> tuple[SchedulingContext, SchedulingResult]:
    return syncer_helpers.routed(ENDPOINTS, keys, pick, known)










def not_home(key: int) -> Endpoint:
    home = rendezvous(key, IDS)
    return next(e for e in ENDPOINTS if e.id != home)


def test_cold_siblings_on_two_replicas_meet_at_the_rendezvous_endpoint_without_a_claim(valkey_server: ValkeyServer) -> None:
    async def run() -> None:
        a, b = syncer(valkey_server, coldPlacement="rendezvous"), syncer(valkey_server, coldPlacement="rendezvous")
        try:
            await started(a, b)
            prefix = list(range(1, 41))
            home = rendezvous(prefix[0], IDS)
            picks = [e for e in ENDPOINTS if e.id != home][:2]
            first = await a.coordinate(*routed(prefix + [101], picks[0]))
            sibling = await b.coordinate(*routed(prefix + [201], picks[1]))
            assert first.destinations == [home] and sibling.destinations == [home]
            assert first.targets[0].id == home and (a.claims["rendezvous"], b.claims["rendezvous"]) == (1, 1)
            assert a.claims["adopted"] == a.claims["kept"] == b.claims["adopted"] == b.claims["kept"] == 0
        finally:
            await stopped(a, b)

    asyncio.run(run())


def test_the_background_claim_is_adopted_by_a_claiming_replica(valkey_server: ValkeyServer) -> None:
    async def run() -> None:
        a, c = syncer(valkey_server, coldPlacement="rendezvous"), syncer(valkey_server)
        try:
            await started(a, c)
            prefix = list(range(3000, 3040))
            home = rendezvous(prefix[0], IDS)
            await a.coordinate(*routed(prefix + [1], not_home(prefix[0])))
            await until(lambda: not a._background)  # the claim written off the routing path
            # c's pick holds the prompt's first 2 blocks: fewer than the claim, which wins
            adopted = await c.coordinate(*routed(prefix + [2], not_home(prefix[0]), {not_home(prefix[0]): 2}))
            assert adopted.destinations == [home] and c.claims["adopted"] == 1
        finally:
            await stopped(a, c)

    asyncio.run(run())


def test_a_prompt_partly_held_somewhere_waits_for_the_claim(valkey_server: ValkeyServer) -> None:
    async def run() -> None:
        a, b = syncer(valkey_server, coldPlacement="rendezvous"), syncer(valkey_server, coldPlacement="rendezvous")
        try:
            await started(a, b)
            prefix = list(range(5000, 5040))
            pick = not_home(prefix[0])
            holder = next(e for e in ENDPOINTS if e not in (pick,) and e.id != rendezvous(prefix[0], IDS))
            first = await a.coordinate(*routed(prefix + [1], pick, {holder: 3}))
            assert first.destinations == [pick.id] and a.claims["kept"] == 1 and a.claims["rendezvous"] == 0
            sibling = await b.coordinate(*routed(prefix + [2], holder, {holder: 3}))
            assert sibling.destinations == [pick.id] and b.claims["adopted"] == 1  # the claim is deeper
        finally:
            await stopped(a, b)

    asyncio.run(run())


def test_store_gone_keeps_the_local_pick_and_rendezvous_resumes_after_restart(valkey_server: ValkeyServer) -> None:
    async def run() -> None:
        a = syncer(valkey_server, coldPlacement="rendezvous")
        try:
            await started(a)
            valkey_server.kill()
            await until(lambda: not a.up, timeout=10)
            ctx, result = routed(list(range(7000, 7040)), not_home(7000))
            assert (await a.coordinate(ctx, result)) is result and a.claims["skipped"] == 1
            await asyncio.to_thread(valkey_server.restart)
            await until(lambda: a.up)
            placed = await a.coordinate(*routed(list(range(7100, 7140)), not_home(7100)))
            assert placed.destinations == [rendezvous(7100, IDS)] and a.claims["rendezvous"] == 1
        finally:
            await stopped(a)

    asyncio.run(run())


def test_the_trace_logs_own_and_peer_counts_and_decisions_with_monotonic_stamps(valkey_server: ValkeyServer) -> None:
    async def run() -> None:
        a, b = syncer(valkey_server, traceSize=1000), syncer(valkey_server, traceSize=1000)
        try:
            await started(a, b)
            before = time.monotonic()
            a.inflight.start("req-1", IDS[0], 100)
            await until(lambda: b.inflight.requests(IDS[0]) == 1)
            await b.coordinate(*routed(list(range(9000, 9010)), ENDPOINTS[0]))
            a_trace = a.state(detailed=True).details["inflightTrace"]
            b_trace = b.state(detailed=True).details["inflightTrace"]
            assert ["own", {IDS[0]: 1}] in [[kind, counts] for kind, at, counts in a_trace if at >= before]
            seen = next(at for kind, at, counts in b_trace if kind == "peers" and counts == {IDS[0]: 1})
            decided = next(at for kind, at, _ in b_trace if kind == "decision")
            own_at = next(at for kind, at, counts in a_trace if kind == "own" and counts == {IDS[0]: 1})
            assert before <= own_at <= seen <= decided <= time.monotonic()
            assert "inflightTrace" not in a.state().details
        finally:
            await stopped(a, b)

    asyncio.run(run())


def test_a_change_is_written_at_once_and_the_immediate_connection_comes_back_with_the_store(
    valkey_server: ValkeyServer,
) -> None:
    async def run() -> None:
        a, b = syncer(valkey_server), syncer(valkey_server)
        try:
            await started(a, b)
            assert a.immediate is not None
            await until(lambda: a.immediate.connected)
            a._dirty.clear()
            a.inflight.start("req-1", IDS[1], 10)
            assert not a._dirty.is_set()  # not left to the background publish
            await until(lambda: b.inflight.requests(IDS[1]) == 1 and not a.immediate.outstanding)
            valkey_server.kill()
            await until(lambda: not (a.up or a.immediate.connected), timeout=10)
            a.inflight.finish("req-1")  # store gone: falls back to the background path, no error
            await asyncio.to_thread(valkey_server.restart)
            await until(lambda: a.up and b.up and a.immediate.connected and b.inflight.requests(IDS[1]) == 0)
            a.inflight.start("req-2", IDS[2], 10)
            await until(lambda: b.inflight.requests(IDS[2]) == 1)
        finally:
            await stopped(a, b)

    asyncio.run(run())


def test_with_a_password_the_raw_connections_authenticate(valkey_server: ValkeyServer,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    import redis

    admin = redis.Redis(host=valkey_server.host, port=valkey_server.port)
    admin.config_set("requirepass", "s3cret")
    admin.close()
    monkeypatch.setenv("PPC_TEST_VALKEY_PASSWORD", "s3cret")

    async def run() -> None:
        a = syncer(valkey_server, passwordEnv="PPC_TEST_VALKEY_PASSWORD")
        b = syncer(valkey_server, passwordEnv="PPC_TEST_VALKEY_PASSWORD")
        try:
            await started(a, b)
            assert a.immediate is not None
            await until(lambda: a.immediate.connected)
            a.inflight.start("req-1", IDS[3], 10)
            await until(lambda: b.inflight.requests(IDS[3]) == 1)
        finally:
            await stopped(a, b)

    asyncio.run(run())


def test_a_lost_immediate_connection_is_reopened_while_the_subscription_lives(valkey_server: ValkeyServer) -> None:
    async def run() -> None:
        a, b = syncer(valkey_server), syncer(valkey_server)
        try:
            await started(a, b)
            assert a.immediate is not None
            await until(lambda: a.immediate.connected)
            a.immediate.close()  # as a server-side CLIENT KILL or idle timeout would
            await until(lambda: a.immediate.connected)
            assert a.up
            a.inflight.start("req-1", IDS[0], 10)
            await until(lambda: b.inflight.requests(IDS[0]) == 1)
        finally:
            await stopped(a, b)

    asyncio.run(run())
