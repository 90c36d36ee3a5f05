"""In-flight counts read on the routing path, on a real Valkey: the claim script returns every
replica's requests per endpoint as the store ordered them and counts its own answer, places a cold
unclaimed prompt on the least-loaded endpoint, and a store paused mid-claim leaves the counts
right once it is back."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis
import syncer_helpers
from syncer_helpers import started, stopped, syncer, until

from ppc_extproc.framework import Endpoint, SchedulingContext, SchedulingResult
from ppc_extproc.ids import EndpointId
from ppc_extproc.plugins.datalayer.redis_syncer import RedisSyncer
from ppc_extproc_lab.valkey import ValkeyServer

pytestmark = pytest.mark.integration

ENDPOINTS = [Endpoint(f"10.0.2.{i}", 8000) for i in range(1, 4)]
IDS = [e.id for e in ENDPOINTS]


def routed(keys: list[int], pick: Endpoint, known: dict[Endpoint, int] | None = None) -> tuple[SchedulingContext, SchedulingResult]:
    return syncer_helpers.routed(ENDPOINTS, keys, pick, known)


def stored(server: ValkeyServer, plugin: RedisSyncer) -> dict[str, int]:
    """``plugin``'s hash of requests per endpoint in the store (zero fields left out)."""
    client = redis.Redis(host=server.host, port=server.port)
    try:
        raw = client.hgetall(plugin.store.counts_key)
    finally:
        client.close()
    return {k.decode(): int(v) for k, v in raw.items() if int(v)}


def decisions(plugin: RedisSyncer) -> list[tuple[float, dict[str, float]]]:
    return [(at, view) for kind, at, view in plugin.state(detailed=True).details["inflightTrace"] if kind == "decision"]


def test_a_decision_sees_a_peer_decision_the_store_ordered_before_it(valkey_server: ValkeyServer) -> None:
    async def run() -> None:
        a, b = syncer(valkey_server, traceSize=100), syncer(valkey_server, traceSize=100)
        try:
            await started(a, b)
            await a.coordinate(*routed(list(range(100, 140)), ENDPOINTS[0]))
            # before a starts the request locally (so before any publish), the script counted it
            assert stored(valkey_server, a) == {IDS[0]: 1}
            a.inflight.start("a-1", IDS[0])  # as the router does, at once: no second count
            await b.coordinate(*routed(list(range(200, 240)), ENDPOINTS[1]))
            assert decisions(b)[-1][1] == {IDS[0]: 1}
            b.inflight.start("b-1", IDS[1])
            await until(lambda: stored(valkey_server, a) == {IDS[0]: 1} and stored(valkey_server, b) == {IDS[1]: 1})
            await a.coordinate(*routed(list(range(300, 340)), ENDPOINTS[2]))
            assert decisions(a)[-1][1] == {IDS[0]: 1, IDS[1]: 1}
            a.inflight.start("a-2", IDS[2])
            a.inflight.finish("a-1")
            await until(lambda: stored(valkey_server, a) == {IDS[2]: 1})
            await b.coordinate(*routed(list(range(400, 440)), ENDPOINTS[1]))
            assert decisions(b)[-1][1] == {IDS[1]: 1, IDS[2]: 1}
        finally:
            await stopped(a, b)

    asyncio.run(run())


def test_a_cold_unclaimed_prompt_goes_to_the_least_loaded_endpoint_and_its_siblings_follow(
    valkey_server: ValkeyServer,
) -> None:
    async def run() -> None:
        a, b = syncer(valkey_server), syncer(valkey_server)
        try:
            await started(a, b)
            for i in range(2):
                a.inflight.start(f"a-{i}", IDS[0])
            b.inflight.start("b-0", IDS[1])
            await until(lambda: stored(valkey_server, a) == {IDS[0]: 2} and stored(valkey_server, b) == {IDS[1]: 1})
            prefix = list(range(1000, 1040))
            placed = await b.coordinate(*routed(prefix + [1], ENDPOINTS[0]))
            assert placed.targets == [ENDPOINTS[2]] and placed.destinations == [IDS[2]]
            assert b.claims["placed"] == 1
            sibling = await a.coordinate(*routed(prefix + [2], ENDPOINTS[1]))
            assert sibling.targets == [ENDPOINTS[2]] and a.claims["adopted"] == 1
            # a warm prompt keeps its pick whatever the load (its prefix outweighs it)
            warm = await b.coordinate(*routed(list(range(2000, 2040)), ENDPOINTS[0], {ENDPOINTS[0]: 10}))
            assert warm.targets == [ENDPOINTS[0]] and b.claims["placed"] == 1
        finally:
            await stopped(a, b)

    asyncio.run(run())


def test_without_claim_counts_the_pick_stands_and_nothing_is_counted_by_the_script(valkey_server: ValkeyServer) -> None:
    async def run() -> None:
        a = syncer(valkey_server, claimCounts=False)
        try:
            await started(a)
            a.inflight.start("a-0", IDS[0])
            result = await a.coordinate(*routed(list(range(3000, 3040)), ENDPOINTS[0]))
            assert result.targets == [ENDPOINTS[0]] and a.claims["kept"] == 1
            assert stored(valkey_server, a) == {}
        finally:
            await stopped(a)

    asyncio.run(run())


def test_a_store_paused_mid_claim_routes_locally_and_the_counts_come_right_after(valkey_server: ValkeyServer) -> None:
    async def run() -> None:
        a, b = syncer(valkey_server, traceSize=100), syncer(valkey_server)
        try:
            await started(a, b)
            valkey_server.pause()
            try:
                ctx, result = routed(list(range(4000, 4040)), ENDPOINTS[1])
                started_at = time.monotonic()
                assert (await a.coordinate(ctx, result)) is result  # the claim timed out: the local pick
                assert a.claims["timeout"] == 1 and time.monotonic() - started_at < 1.0
                a.inflight.start("a-0", IDS[1])
            finally:
                valkey_server.resume()
            # the script may have run once the store woke up: counted once all the same
            await until(lambda: stored(valkey_server, a) == {IDS[1]: 1})
            await until(lambda: b.up and a.up)
            b_result = await b.coordinate(*routed(list(range(5000, 5040)), ENDPOINTS[2]))
            b.inflight.start("b-0", b_result.targets[0].id)
            await until(lambda: stored(valkey_server, a) == {IDS[1]: 1} and stored(valkey_server, b) == {IDS[2]: 1})
        finally:
            await stopped(a, b)

    asyncio.run(run())


def test_the_trace_stamps_a_counted_decision_on_the_store_clock_and_logs_its_commit(valkey_server: ValkeyServer) -> None:
    async def run() -> None:
        a = syncer(valkey_server, traceSize=100)
        try:
            await started(a)
            before = time.monotonic()
            result = await a.coordinate(*routed(list(range(6000, 6040)), ENDPOINTS[0]))
            a.inflight.start("a-0", result.targets[0].id)
            after = time.monotonic()
            trace = a.state(detailed=True).details["inflightTrace"]
            decided = next(at for kind, at, _ in trace if kind == "decision")
            logged, commit = next((at, c) for kind, at, c in trace if kind == "commit")
            assert commit == {EndpointId(result.targets[0].id): decided}
            # the script's instant (server TIME on this machine's wall clock) falls inside the call
            assert before - 0.005 <= decided <= logged <= after
            own = next(at for kind, at, c in trace if kind == "own" and c == {IDS[0]: 1})
            assert logged <= own
        finally:
            await stopped(a)

    asyncio.run(run())


def test_a_claim_cancelled_mid_flight_leaves_no_claim_outstanding(valkey_server: ValkeyServer) -> None:
    async def run() -> None:
        a = syncer(valkey_server, claimTimeout="2s")
        try:
            await started(a)
            valkey_server.pause()
            try:
                task = asyncio.create_task(a.coordinate(*routed(list(range(7000, 7040)), ENDPOINTS[0])))
                await until(lambda: a.counts.outstanding == 1)
                task.cancel()  # the client went away while the claim waited
                with pytest.raises(asyncio.CancelledError):
                    await task
                assert a.counts.outstanding == 0 and a.counts.resync
            finally:
                valkey_server.resume()
            a.inflight.start("a-0", IDS[1])
            await until(lambda: stored(valkey_server, a) == {IDS[1]: 1})
        finally:
            await stopped(a)

    asyncio.run(run())
