"""Endpoint health: only a connection failure Envoy reported takes an endpoint out of routing; KV
disconnects only corroborate it; when every candidate is held down the router routes among all."""

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


def test_a_dropped_kv_connection_never_takes_the_endpoint_out() -> None:
    health = tracked(A, B)
    health.kv_connection(A.id, True)
    health.kv_connection(A.id, False)
    assert health.routable([A, B]) == [A, B]
    assert health.down() == {} and health.kv_disconnected() == [A.id]
    health.kv_connection(A.id, True)
    assert health.kv_disconnected() == [] and health.transitions() == {}


def test_a_kv_disconnect_around_a_connection_failure_keeps_the_hold_until_it_reconnects() -> None:
    clock = Clock()
    health = tracked(A, B, clock=clock)
    health.kv_connection(A.id, True)
    health.upstream(A.id, reached=False)  # the engine died: Envoy could not connect
    clock.now += 0.02
    health.kv_connection(A.id, False)  # … and its publisher is gone too
    clock.now += 10.0  # far past the 1 s hold: still out while its subscriber is
    assert health.routable([A, B]) == [B]
    health.kv_connection(A.id, True)  # restarted
    assert health.routable([A, B]) == [A, B]
    health.upstream(A.id, reached=False)  # a new streak starts at 1 s
    clock.now += 1.0
    assert health.routable([A, B]) == [A, B]


def test_an_old_kv_disconnect_does_not_prolong_a_hold() -> None:
    clock = Clock()
    health = tracked(A, B, clock=clock)
    health.kv_connection(A.id, True)
    health.kv_connection(A.id, False)  # the publisher went away long ago; the engine serves
    clock.now += 3600.0
    health.upstream(A.id, reached=False)
    assert health.routable([A, B]) == [B]
    clock.now += 1.0
    assert health.routable([A, B]) == [A, B]


def test_a_corroborated_hold_is_capped() -> None:
    clock = Clock()
    health = tracked(A, B, clock=clock, options=HealthOptions(upstream_backoff_max_seconds=30.0))
    health.kv_connection(A.id, True)
    health.kv_connection(A.id, False)
    health.upstream(A.id, reached=False)
    clock.now += 29.0
    assert health.routable([A, B]) == [B]
    clock.now += 2.0
    assert health.routable([A, B]) == [A, B]  # on probation after 30 s, publisher or not


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


def test_deleted_endpoints_are_forgotten_and_unknown_ones_ignored() -> None:
    health = tracked(A)
    health.upstream(A.id, reached=False)
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


def test_the_router_avoids_held_endpoints_and_routes_among_all_when_every_one_is_held() -> None:
    router = router_over(A, B, C)
    router.health.upstream(A.id, reached=False)
    router.health.upstream(C.id, reached=False)
    for i in range(20):
        decision = asyncio.run(router.route(LLMRequest(f"r{i}", "m")))
        assert decision.primary == B
    assert router.route_header_only() == B
    assert router.health.panics == 0
    router.health.upstream(B.id, reached=False)
    picked = {asyncio.run(router.route(LLMRequest(f"p{i}", "m"))).primary for i in range(40)}
    assert picked == {A, B, C}  # panic: the pool is never emptied
    assert router.health.panics == 40
    assert router.health.view()["panics"] == 40


def test_a_subset_hint_whose_endpoints_are_all_held_still_routes_within_it() -> None:
    router = router_over(A, B, C)
    router.health.upstream(A.id, reached=False)
    decision = asyncio.run(router.route(LLMRequest("r", "m"), [A.id]))
    assert decision.primary == A and router.health.panics == 1


def test_an_empty_pool_is_still_503() -> None:
    router = router_over()
    with pytest.raises(NoEndpointsError, match="failed to find endpoint candidates"):
        asyncio.run(router.route(LLMRequest("r", "m")))


def test_the_response_path_reports_to_health() -> None:
    router = router_over(A, B)
    ctx = SchedulingContext(LLMRequest("r", "m"), [A, B])
    router.response_complete(ctx, ResponseInfo("r", A.id, status=503, reached=False))
    assert router.health.down() == {A.id: [DownReason.UPSTREAM_FAILURE]}
    router.response_complete(ctx, ResponseInfo("r", B.id, status=0, reached=None, cancelled=True))
    assert B.id not in router.health.down()  # unknown: no evidence either way
    router.response_complete(ctx, ResponseInfo("r", A.id, status=500, reached=True))  # the engine's own error
    assert router.health.down() == {}


def test_panics_are_a_prometheus_counter() -> None:
    from prometheus_client import CollectorRegistry

    from ppc_extproc.observability.metrics import ServiceState, StateCollector

    router = router_over(A)
    router.health.upstream(A.id, reached=False)
    for i in range(3):
        asyncio.run(router.route(LLMRequest(f"r{i}", "m")))
    registry = CollectorRegistry()
    health = router.health
    registry.register(StateCollector(lambda: ServiceState({}, 1, [], {A.id: False}, health.transitions(), health.panics)))
    assert registry.get_sample_value("ppc_extproc_health_panic_total") == 3
    assert registry.get_sample_value("ppc_extproc_endpoint_down_total", {"endpoint": A.id, "reason": "upstream_failure"}) == 1
