"""Session bindings shared through a real Valkey: two binding tables (two replicas' worth) agree,
a rebind after a pod died wins once, and a store that is down or comes back never fails a lookup."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
import redis.asyncio
from epp_helpers import router_for

from ppc_extproc.config.epp import load_config_text
from ppc_extproc.framework import Endpoint, LLMRequest
from ppc_extproc.ids import EndpointId
from ppc_extproc.sessions import BindingTable, SessionBindings, StoreConfig
from ppc_extproc_lab.localcluster.sessions import session_scorer_config
from ppc_extproc_lab.valkey import ValkeyServer

pytestmark = pytest.mark.integration

A, B, C = EndpointId("10.0.0.1:8000"), EndpointId("10.0.0.2:8000"), EndpointId("10.0.0.3:8000")


def replica(server: ValkeyServer, *, timeout_ms: float = 200, retry_seconds: float = 0.2) -> SessionBindings:
    config = StoreConfig(address=server.url, timeout_seconds=timeout_ms / 1000, retry_seconds=retry_seconds)
    return SessionBindings("session-affinity-scorer", BindingTable(ttl_seconds=60), config)


async def started(*replicas: SessionBindings) -> None:
    for r in replicas:
        await r.start()


def test_a_binding_made_on_one_replica_is_found_on_the_other(valkey_server: ValkeyServer) -> None:
    async def scenario() -> None:
        one, two = replica(valkey_server), replica(valkey_server)
        await started(one, two)
        try:
            assert await two.lookup("s1") is None
            one.commit("s1", A, None)
            await one.flush()
            assert await two.lookup("s1") == A  # adopted into two's table
            assert two.table.peek("s1") == A and two.stats.hits == 1
            # a replica that binds first wins; the other's first bind adopts it
            two.commit("s2", B, None)
            await two.flush()
            one.commit("s2", C, None)
            await one.flush()
            assert one.table.peek("s2") == B and one.stats.adopted == 1
        finally:
            await one.stop()
            await two.stop()

    asyncio.run(scenario())


def test_a_rebind_from_a_dead_endpoint_happens_once(valkey_server: ValkeyServer) -> None:
    async def scenario() -> None:
        one, two = replica(valkey_server), replica(valkey_server)
        await started(one, two)
        try:
            one.commit("s1", A, None)
            await one.flush()
            assert await two.lookup("s1") == A
            # A died: both replicas see it gone and move the session, each to its own pick
            one.commit("s1", B, A)
            await one.flush()
            two.commit("s1", C, A)
            await two.flush()
            assert two.table.peek("s1") == B  # the second rebind found A already replaced
            assert await one.lookup("s1") == B and await two.lookup("s1") == B
        finally:
            await one.stop()
            await two.stop()

    asyncio.run(scenario())


def test_the_store_down_means_local_bindings_and_back_means_shared_again(valkey_server: ValkeyServer) -> None:
    async def scenario() -> None:
        one, two = replica(valkey_server, timeout_ms=100, retry_seconds=0.1), replica(valkey_server)
        await started(one, two)
        try:
            one.commit("s1", A, None)
            await one.flush()
            valkey_server.kill()
            started_at = time.monotonic()
            for _ in range(3):  # failureThreshold: three failures in a row before the store is skipped
                assert one.store_up is True
                assert await one.lookup("s1") == A  # local answer, no exception
            assert one.stats.errors == 3 and one.store_up is False
            one.commit("s2", B, None)  # bound while the store is away: local only
            for _ in range(50):
                assert await one.lookup("s2") == B
            # skipped while backing off: 50 lookups do not each wait for the store
            assert time.monotonic() - started_at < 5.0
            valkey_server.restart()  # empty
            while not one.store_up:
                await asyncio.sleep(0.01)
            assert await one.lookup("s2") == B  # the store has none: the local binding is shared
            await one.flush()
            assert await two.lookup("s2") == B
        finally:
            await one.stop()
            await two.stop()

    asyncio.run(scenario())


def test_shared_bindings_expire_with_the_ttl(valkey_server: ValkeyServer) -> None:
    async def scenario() -> None:
        config = StoreConfig(address=valkey_server.url, timeout_seconds=0.2)
        one = SessionBindings("f", BindingTable(ttl_seconds=0.3), config)
        two = SessionBindings("f", BindingTable(ttl_seconds=0.3), config)
        await started(one, two)
        try:
            one.commit("s1", A, None)
            await one.flush()
            assert await two.lookup("s1") == A
            raw = redis.asyncio.Redis.from_url(valkey_server.url)
            try:
                (key,) = await raw.keys("ppc-extproc:sessions:f:*")
                assert key == b"ppc-extproc:sessions:f:s1" and 0 < await raw.pttl(key) <= 300
                deadline = time.monotonic() + 10
                while await raw.exists(key):  # EXISTS does not refresh the TTL
                    assert time.monotonic() < deadline, "the store kept the key past its TTL"
                    await asyncio.sleep(0.05)
            finally:
                await raw.aclose()
        finally:
            await one.stop()
            await two.stop()

    asyncio.run(scenario())


def test_more_concurrent_lookups_than_connections_wait_instead_of_failing(valkey_server: ValkeyServer) -> None:
    async def scenario() -> None:
        one = replica(valkey_server, timeout_ms=2000)
        await one.start()
        try:
            for i in range(300):
                one.commit(f"s{i}", A, None)
            await one.flush()
            found = await asyncio.gather(*(one.lookup(f"s{i}") for i in range(300)))  # > 64 connections
            assert found == [A] * 300 and one.stats.errors == 0 and one.stats.hits == 300
        finally:
            await one.stop()

    asyncio.run(scenario())


def test_a_sessions_binding_is_in_the_store_by_the_time_its_routing_answer_is(valkey_server: ValkeyServer) -> None:
    # Two replicas' routers over one store: a session's next turn, routed by the other replica the
    # moment the first answered, finds the binding (no background write left to race).
    endpoints = [Endpoint(f"10.0.1.{i}", 8000) for i in range(1, 4)]
    text = json.dumps(session_scorer_config(valkey_server.url))
    one, two = (load_config_text(text) for _ in range(2))

    async def scenario() -> None:
        plugins = [p for loaded in (one, two) for p in loaded.roles.lifecycle]
        for plugin in plugins:
            await plugin.start()
        try:
            first, second = router_for(one, endpoints), router_for(two, endpoints)
            for i in range(30):
                headers = {"x-session-id": f"fresh-{i}"}
                picked = await first.route(LLMRequest(f"a{i}", "m", headers=headers))
                again = await second.route(LLMRequest(f"b{i}", "m", headers=headers))
                assert again.primary == picked.primary, i
        finally:
            for plugin in plugins:
                await plugin.stop()

    asyncio.run(scenario())
