"""Endpoint health: evidence from KV-event connections, metric polls and responses takes endpoints
out of routing and puts them back; the router answers 503 at once when none is left."""

from __future__ import annotations

import asyncio

import pytest

from ppc_extproc.config.epp import load_config_text
from ppc_extproc.errors import NoEndpointsError
from ppc_extproc.framework import (
    Endpoint,
    EndpointEvent,
    EndpointEventKind,
    LLMRequest,
    ResponseInfo,
    SchedulingContext,
)
from ppc_extproc.plugins.registry import Services
from ppc_extproc.scheduling.health import DownReason, EndpointHealth, HealthOptions
from ppc_extproc.scheduling.pool import EndpointPool
from ppc_extproc.scheduling.router import Router

A, B, C = Endpoint("10.0.0.1", 8000), Endpoint("10.0.0.2", 8000), Endpoint("10.0.0.3", 8000)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def tracked(*endpoints: Endpoint, options: HealthOptions | None = None, clock: Clock | None = None) -> EndpointHealth:
    health = EndpointHealth(options, clock=clock or Clock())
    for endpoint in endpoints:
        health.on_endpoint_event(EndpointEvent(EndpointEventKind.ADDED, endpoint))
    return health


def test_a_dropped_kv_connection_takes_the_endpoint_out_until_it_reconnects() -> None:
    health = tracked(A, B)
    health.kv_connection(A.id, False)  # never connected yet: no conclusion (a wrong port must not empty the fleet)
    assert health.routable([A, B]) == [A, B]
    health.kv_connection(A.id, True)
    health.kv_connection(A.id, False)
    assert health.routable([A, B]) == [B]
    assert health.down() == {A.id: [DownReason.KV_DISCONNECTED]}
    health.kv_connection(A.id, True)
    assert health.routable([A, B]) == [A, B]
    assert health.transitions() == {(A.id, DownReason.KV_DISCONNECTED): 1}


def test_consecutive_failed_polls_take_an_endpoint_out_and_one_good_poll_brings_it_back() -> None:
    health = tracked(A, B, options=HealthOptions(poll_failures_down=3))
    for _ in range(2):
        health.poll(A.id, False)
    assert health.routable([A, B]) == [A, B]
    health.poll(A.id, False)
    assert health.routable([A, B]) == [B]
    health.poll(A.id, True)
    assert health.routable([A, B]) == [A, B]


def test_an_upstream_failure_holds_the_endpoint_for_a_doubling_backoff() -> None:
    clock = Clock()
    health = tracked(A, B, clock=clock, options=HealthOptions(upstream_backoff_seconds=1.0, upstream_backoff_max_seconds=3.0))
    health.upstream(A.id, reached=False)
    assert health.routable([A, B]) == [B]
    clock.now += 1.0
    assert health.routable([A, B]) == [A, B]  # probation after the hold
    health.upstream(A.id, reached=False)  # failed again: twice as long
    clock.now += 1.9
    assert health.routable([A, B]) == [B]
    clock.now += 0.1
    assert health.routable([A, B]) == [A, B]
    health.upstream(A.id, reached=False)
    clock.now += 2.9  # capped at 3 s
    assert health.routable([A, B]) == [B]
    clock.now += 0.1
    assert health.routable([A, B]) == [A, B]
    health.upstream(A.id, reached=True)  # the engine answered: the next failure starts at 1 s again
    health.upstream(A.id, reached=False)
    clock.now += 1.0
    assert health.routable([A, B]) == [A, B]


def test_every_source_must_agree_before_an_endpoint_is_back() -> None:
    health = tracked(A)
    health.kv_connection(A.id, True)
    health.kv_connection(A.id, False)
    for _ in range(3):
        health.poll(A.id, False)
    health.kv_connection(A.id, True)
    assert health.routable([A]) == []
    assert health.down() == {A.id: [DownReason.POLL_FAILURES]}
    health.poll(A.id, True)
    assert health.routable([A]) == [A]


def test_deleted_endpoints_are_forgotten_and_unknown_ones_ignored() -> None:
    health = tracked(A)
    health.kv_connection(A.id, True)
    health.kv_connection(A.id, False)
    health.on_endpoint_event(EndpointEvent(EndpointEventKind.DELETED, A))
    health.upstream("10.9.9.9:8000", reached=False)  # never in the pool: no state kept
    assert health.down() == {} and health.endpoints() == []
    health.on_endpoint_event(EndpointEvent(EndpointEventKind.ADDED, A))
    assert health.routable([A]) == [A]  # a re-added endpoint starts clean


CONFIG = """
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: random-picker
"""


def router_over(*endpoints: Endpoint) -> Router:
    services = Services()
    loaded = load_config_text(CONFIG, services=services)
    pool = EndpointPool()
    pool.subscribe(services.health.on_endpoint_event)
    pool.replace(list(endpoints))
    return Router(pool, loaded.pipeline, inflight=services.inflight, health=services.health)


def test_the_router_never_picks_an_unroutable_endpoint_and_answers_503_when_none_is_left() -> None:
    router = router_over(A, B, C)
    router.health.upstream(A.id, reached=False)
    router.health.upstream(C.id, reached=False)
    for i in range(20):
        decision = asyncio.run(router.route(LLMRequest(f"r{i}", "m")))
        assert decision.primary == B
    assert router.route_header_only() == B
    router.health.upstream(B.id, reached=False)
    with pytest.raises(NoEndpointsError, match="every candidate endpoint is unavailable"):
        asyncio.run(router.route(LLMRequest("last", "m")))


def test_the_response_path_reports_to_health() -> None:
    router = router_over(A, B)
    ctx = SchedulingContext(LLMRequest("r", "m"), [A, B])
    router.response_complete(ctx, ResponseInfo("r", A.id, status=503, reached=False))
    assert router.health.down() == {A.id: [DownReason.UPSTREAM_FAILURE]}
    router.response_complete(ctx, ResponseInfo("r", B.id, status=0, reached=None, cancelled=True))
    assert B.id not in router.health.down()  # unknown: no evidence either way
    router.response_complete(ctx, ResponseInfo("r", A.id, status=500, reached=True))  # the engine's own error
    assert router.health.down() == {}
