"""Prefix claims on a real Valkey: two replicas' syncers agree on one endpoint for siblings of one
prompt, a pick that already holds the prefix keeps it, and a store that is gone costs nothing."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest
import syncer_helpers
from syncer_helpers import started, syncer

from ppc_extproc.framework import Endpoint, SchedulingContext, SchedulingResult
from ppc_extproc.plugins.datalayer.redis_syncer import RedisSyncer
from ppc_extproc_lab.valkey import ValkeyServer

pytestmark = pytest.mark.integration

ENDPOINTS = [Endpoint(f"10.0.0.{i}", 8000) for i in range(1, 4)]


def routed(keys: list[int], pick: Endpoint, known: dict[Endpoint, int] | None = None) -> tuple[SchedulingContext, SchedulingResult]:
    return syncer_helpers.routed(ENDPOINTS, keys, pick, known)








def with_pair(server: ValkeyServer, body: Callable[[RedisSyncer, RedisSyncer], Awaitable[None]]) -> None:
    """Run ``body`` with two started syncers (two replicas) on ``server``; stop them after."""

    async def run() -> None:
        a, b = syncer(server), syncer(server)
        try:
            await started(a, b)
            await body(a, b)
        finally:
            await a.stop()
            await b.stop()

    asyncio.run(run())


def test_siblings_routed_by_two_replicas_land_on_one_endpoint(valkey_server: ValkeyServer) -> None:
    async def run(a: RedisSyncer, b: RedisSyncer) -> None:
        prefix = list(range(1, 41))
        first = await a.coordinate(*routed(prefix + [101, 102], ENDPOINTS[0]))
        sibling = await b.coordinate(*routed(prefix + [201, 202], ENDPOINTS[1]))
        assert first.targets == [ENDPOINTS[0]]
        assert sibling.targets == [ENDPOINTS[0]] and sibling.destinations == [ENDPOINTS[0].id]
        assert (a.claims["kept"], b.claims["adopted"]) == (1, 1)

    with_pair(valkey_server, run)


def test_a_pick_that_already_holds_the_prefix_keeps_it(valkey_server: ValkeyServer) -> None:
    async def run(a: RedisSyncer, b: RedisSyncer) -> None:
        prefix = list(range(1000, 1040))
        await a.coordinate(*routed(prefix + [1], ENDPOINTS[0]))
        kept = await b.coordinate(*routed(prefix + [2], ENDPOINTS[2], {ENDPOINTS[2]: 41}))
        assert kept.targets == [ENDPOINTS[2]]
        deeper_known = await b.coordinate(*routed(prefix + [3, 4], ENDPOINTS[1], {ENDPOINTS[1]: 40}))
        assert deeper_known.targets == [ENDPOINTS[1]]

    with_pair(valkey_server, run)


def test_a_claimant_the_filters_left_out_is_not_adopted(valkey_server: ValkeyServer) -> None:
    async def run(a: RedisSyncer, b: RedisSyncer) -> None:
        prefix = list(range(5000, 5040))
        await a.coordinate(*routed(prefix + [1], ENDPOINTS[0]))
        ctx, result = routed(prefix + [2], ENDPOINTS[1])
        del result.primary.totals[ENDPOINTS[0].id]  # filtered out for this request
        assert (await b.coordinate(ctx, result)).targets == [ENDPOINTS[1]]

    with_pair(valkey_server, run)


def test_store_gone_routes_on_the_local_pick_and_claims_resume_after_restart(valkey_server: ValkeyServer) -> None:
    async def run() -> None:
        a, b = syncer(valkey_server), syncer(valkey_server)
        try:
            await started(a, b)
            valkey_server.kill()
            async with asyncio.timeout(10):
                while a.up or b.up:
                    await asyncio.sleep(0.01)
            ctx, result = routed(list(range(7000, 7040)), ENDPOINTS[1])
            assert (await b.coordinate(ctx, result)) is result
            assert b.claims["skipped"] == 1
            await asyncio.to_thread(valkey_server.restart)
            async with asyncio.timeout(5):
                while not (a.up and b.up and a.peers.live() == 1 and b.peers.live() == 1):
                    await asyncio.sleep(0.01)
            await a.coordinate(*routed(list(range(8000, 8040)) + [1], ENDPOINTS[2]))
            adopted = await b.coordinate(*routed(list(range(8000, 8040)) + [2], ENDPOINTS[0]))
            assert adopted.targets == [ENDPOINTS[2]]
        finally:
            await a.stop()
            await b.stop()

    asyncio.run(run())


def test_a_hanging_store_costs_a_claim_timeout_then_nothing_and_claims_resume(valkey_server: ValkeyServer) -> None:
    async def run() -> None:
        a, b = syncer(valkey_server), syncer(valkey_server)
        try:
            await started(a, b)
            valkey_server.pause()
            pick = ENDPOINTS[1]
            for i in range(5):  # every call returns the local pick: 3 time out, then claims back off
                ctx, result = routed(list(range(9000 + 100 * i, 9040 + 100 * i)), pick)
                assert (await b.coordinate(ctx, result)).targets == [pick]
            assert b.claims["timeout"] == 3 and b.claims["skipped"] >= 1
            async with asyncio.timeout(10):  # the publish times out: both route on local state
                while a.up or b.up:
                    await asyncio.sleep(0.01)
            valkey_server.resume()
            async with asyncio.timeout(10):
                while not (a.up and b.up):
                    await asyncio.sleep(0.01)
            await a.coordinate(*routed(list(range(20000, 20040)) + [1], ENDPOINTS[2]))
            async with asyncio.timeout(10):  # b's back-off after the timeouts lasts one sync interval
                while (await b.coordinate(*routed(list(range(20000, 20040)) + [2], ENDPOINTS[0]))).targets != [ENDPOINTS[2]]:
                    await asyncio.sleep(0.01)
            assert b.claims["adopted"] == 1
        finally:
            valkey_server.resume()
            await a.stop()
            await b.stop()

    asyncio.run(run())


def test_claims_survive_a_flushed_script_and_a_late_reply_is_never_the_next_claims_answer(
    valkey_server: ValkeyServer,
) -> None:
    async def run(a: RedisSyncer, b: RedisSyncer) -> None:
        await a.coordinate(*routed(list(range(30000, 30040)) + [1], ENDPOINTS[2]))
        reader, writer = await asyncio.open_connection(valkey_server.host, valkey_server.port)
        writer.write(b"*2\r\n$6\r\nSCRIPT\r\n$5\r\nFLUSH\r\n")
        assert (await reader.readline()).startswith(b"+OK")
        writer.close()
        # NOSCRIPT on the connection the claims already use: answered by EVAL there
        adopted = await b.coordinate(*routed(list(range(30000, 30040)) + [2], ENDPOINTS[0]))
        assert adopted.targets == [ENDPOINTS[2]] and b.claims["adopted"] == 1
        # a claim that times out leaves its reply on the wire: the next claim must not read it
        b.claim_timeout = 0.02
        valkey_server.pause()
        try:
            ctx, result = routed(list(range(31000, 31040)), ENDPOINTS[1])
            assert (await b.coordinate(ctx, result)).targets == [ENDPOINTS[1]]
            assert b.claims["timeout"] == 1
        finally:
            valkey_server.resume()
        b.claim_timeout = 1.0
        await a.coordinate(*routed(list(range(32000, 32040)) + [1], ENDPOINTS[2]))
        again = await b.coordinate(*routed(list(range(32000, 32040)) + [2], ENDPOINTS[1]))
        assert again.targets == [ENDPOINTS[2]]  # 32000's claim, not 31000's late answer (ENDPOINTS[1])

    with_pair(valkey_server, run)
