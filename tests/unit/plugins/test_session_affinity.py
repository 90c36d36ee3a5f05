"""Session affinity through the loader and the router: session-id-producer, agent-identity, the
session-affinity scorer and filter (both strategies), rebinding when the bound endpoint is gone,
placement, expiry. Local bindings (the shared store is covered by the integration tests)."""

from __future__ import annotations

import asyncio
import base64

import pytest
import yaml
from epp_helpers import config_error, epp, load, router_for

from ppc_extproc.config.epp import load_config_text
from ppc_extproc.framework import (
    AsyncPreRequest,
    Endpoint,
    LLMRequest,
    ResponseInfo,
    SchedulingContext,
    SchedulingResult,
)
from ppc_extproc.framework.params import Section
from ppc_extproc.plugins.filters import SessionAffinityFilter
from ppc_extproc.plugins.producers.agent_identity import AGENT_IDENTITY_KEY, AgentIdentity
from ppc_extproc.plugins.producers.session_id import SESSION_ID, SessionIdProducer, cookie_value
from ppc_extproc.plugins.registry import Services
from ppc_extproc.plugins.scorers import SessionAffinityScorer
from ppc_extproc.scheduling.router import Decision, Router

A = Endpoint("10.0.0.1", 8000, name="ns/pod-a-rank-0")
B = Endpoint("10.0.0.2", 8000, name="ns/pod-b-rank-0")
C = Endpoint("10.0.0.3", 8000, name="ns/pod-c-rank-0")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def route(router: Router, headers: dict[str, str], rid: str = "r") -> Decision:
    return asyncio.run(router.route(LLMRequest(rid, "m", headers=headers)))


def finish(router: Router, decision: Decision, served: Endpoint | None = None) -> None:
    endpoint = (served or decision.primary).id
    router.response_complete(decision.ctx, ResponseInfo(decision.ctx.request.request_id, endpoint))


SESSION_SCORER = """
plugins:
- type: session-affinity-scorer
  parameters:
    strategy: session_id
    sessionIdConfig: {placement: %s}
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins: [{pluginRef: session-affinity-scorer, weight: 10}, {pluginRef: max-score-picker}]
"""


def scorer_router(endpoints: list[Endpoint], placement: str = "none", services: Services | None = None) -> Router:
    return router_for(load(SESSION_SCORER % placement, services), endpoints)


# --- producers -------------------------------------------------------------------------------


def test_session_id_producer_reads_a_header_or_a_cookie() -> None:
    by_header = SessionIdProducer("p", header_name="X-My-Session")
    ctx = SchedulingContext(LLMRequest("r", "m", headers={"x-my-session": "  s-1 "}), [A])
    by_header.produce(ctx)
    assert ctx.get(SESSION_ID.of("p")) == "s-1"
    by_cookie = SessionIdProducer("q", cookie_name="llm-d-session")
    ctx = SchedulingContext(LLMRequest("r", "m", headers={"cookie": "a=1; llm-d-session=abc; b=2"}), [A])
    by_cookie.produce(ctx)
    assert ctx.get(SESSION_ID.of("q")) == "abc"
    empty = SchedulingContext(LLMRequest("r", "m", headers={"x-my-session": "  "}), [A])
    by_header.produce(empty)
    assert empty.get(SESSION_ID.of("p")) is None
    assert cookie_value("x=1;y", "y") == "" and cookie_value("", "y") == ""


@pytest.mark.parametrize("params", ["{}", "{headerName: a, cookieName: b}"])
def test_session_id_producer_needs_exactly_one_source(params: str) -> None:
    error = config_error(epp(f"plugins: [{{type: session-id-producer, parameters: {params}}}, {{type: random-picker}}]\n"))
    assert error.path.endswith("parameters.headerName") and "exactly one of headerName or cookieName" in str(error)


def test_agent_identity_checks_extra_headers_then_the_agents_own() -> None:
    plugin = AgentIdentity.from_parameters("agent-identity", Section({"additionalSessionHeaders": ["X-Mine"]}, "p"),
                                           Services())  # fmt: skip
    assert plugin.headers == ("x-mine", "x-claude-code-session-id", "x-session-affinity", "session-id", "session_id")
    cases = [({"session_id": "old", "session-id": "codex"}, "codex"),
             ({"x-session-affinity": "oc", "x-claude-code-session-id": "cc"}, "cc"),
             ({"x-mine": "m", "x-claude-code-session-id": "cc"}, "m"), ({"other": "x"}, None)]  # fmt: skip
    for headers, expected in cases:
        ctx = SchedulingContext(LLMRequest("r", "m", headers=headers), [A])
        plugin.produce(ctx)
        assert ctx.get(AGENT_IDENTITY_KEY) == expected, headers


# --- session_id strategy ---------------------------------------------------------------------


def test_a_session_stays_on_its_endpoint_and_another_session_may_go_elsewhere() -> None:
    router = scorer_router([A, B, C])
    first = route(router, {"x-session-id": "s1"})
    finish(router, first)
    for i in range(20):
        decision = route(router, {"x-session-id": "s1"}, f"r{i}")
        assert decision.primary == first.primary
        finish(router, decision)
    unbound = {route(router, {"x-session-id": f"other-{i}"}).primary for i in range(30)}
    assert len(unbound) > 1  # unbound sessions express no preference (ties are broken at random)


def test_a_session_whose_endpoint_is_gone_is_rebound_on_its_next_request() -> None:
    router = scorer_router([A, B, C])
    first = route(router, {"x-session-id": "s1"})
    finish(router, first)
    survivors = [e for e in (A, B, C) if e != first.primary]
    router.pool.replace(survivors)  # gone from discovery
    moved = route(router, {"x-session-id": "s1"}, "r-moved")
    assert moved.primary in survivors
    finish(router, moved)
    router.pool.replace([A, B, C])  # back: the session stays where it moved
    for i in range(10):
        assert route(router, {"x-session-id": "s1"}, f"r{i}").primary == moved.primary


def test_an_endpoint_held_down_by_health_makes_its_sessions_move() -> None:
    router = scorer_router([])
    router.pool.subscribe(router.health.on_endpoint_event)
    router.pool.replace([A, B])
    first = route(router, {"x-session-id": "s1"})
    finish(router, first)
    router.health.upstream(first.primary.id, reached=False)  # Envoy could not reach it
    moved = route(router, {"x-session-id": "s1"}, "r2")
    assert moved.primary != first.primary


def test_envoy_serving_elsewhere_moves_the_binding_to_the_endpoint_that_served() -> None:
    router = scorer_router([A, B])
    first = route(router, {"x-session-id": "s1"})
    other = B if first.primary == A else A
    finish(router, first, served=other)  # a retry after a connection failure landed on the other
    for i in range(5):
        assert route(router, {"x-session-id": "s1"}, f"r{i}").primary == other


def test_fewest_bindings_placement_spreads_new_sessions_evenly() -> None:
    router = scorer_router([A, B, C], placement="fewestBindings")
    served: dict[Endpoint, int] = {}
    for i in range(30):
        decision = route(router, {"x-session-id": f"s{i}"}, f"r{i}")
        served[decision.primary] = served.get(decision.primary, 0) + 1
        finish(router, decision)
    assert served == {A: 10, B: 10, C: 10}


def test_the_runner_up_is_spread_over_sessions_so_a_dead_pods_sessions_do_not_herd() -> None:
    # Envoy's fallback (the second target) is where a session goes when its pod fails; with
    # fewestBindings it is the session id's rendezvous choice among the others, on every request.
    d = Endpoint("10.0.0.4", 8000, name="ns/pod-d-rank-0")
    router = router_for(load(SESSION_SCORER.replace("- type: max-score-picker",
                                                    "- type: max-score-picker\n  parameters: {maxNumOfEndpoints: 2}")
                             % "fewestBindings"), [A, B, C, d])  # fmt: skip
    bound_to_a: list[str] = []
    for i in range(120):
        decision = route(router, {"x-session-id": f"s{i}"}, f"r{i}")
        finish(router, decision)
        if decision.primary == A:
            bound_to_a.append(f"s{i}")
    assert len(bound_to_a) == 30
    runners_up: dict[Endpoint, int] = {}
    for session in bound_to_a:
        first, again = (route(router, {"x-session-id": session}, f"{session}-{n}") for n in (1, 2))
        assert first.primary == again.primary == A
        assert first.targets[1] == again.targets[1]
        runners_up[first.targets[1]] = runners_up.get(first.targets[1], 0) + 1
    assert set(runners_up) == {B, C, d} and min(runners_up.values()) >= 4, runners_up


def test_a_dead_pods_sessions_move_to_their_runner_up_on_every_replica_whatever_its_counts() -> None:
    # Envoy fell back to the runner-up while the pod was listed; once it is gone every replica
    # must send the session there too, not to where its own binding counts are lowest.
    d = Endpoint("10.0.0.4", 8000, name="ns/pod-d-rank-0")
    text = SESSION_SCORER.replace("- type: max-score-picker",
                                  "- type: max-score-picker\n  parameters: {maxNumOfEndpoints: 2}") % "fewestBindings"  # fmt: skip
    first, second = router_for(load(text), [A, B, C, d]), router_for(load(text), [A, B, C, d])
    runner_up: dict[str, Endpoint] = {}
    for i in range(60):
        finish(first, route(first, {"x-session-id": f"s{i}"}, f"r{i}"))
        again = route(first, {"x-session-id": f"s{i}"}, f"r{i}-again")  # bound: the runner-up is second
        finish(first, again)
        if again.primary == A:
            runner_up[f"s{i}"] = again.targets[1]
    (other,) = [p for p in second.pipeline.pre_request_async if isinstance(p, SessionAffinityScorer)]
    assert other.core.bindings is not None
    for session in runner_up:  # the second replica learnt the same bindings (from the store) ...
        other.core.bindings.table.bind(session, A.id)
    for i in range(40):  # ... and holds many more on B
        other.core.bindings.table.bind(f"elsewhere-{i}", B.id)
    for router in (first, second):
        router.pool.replace([B, C, d])
        for session, expected in runner_up.items():
            assert route(router, {"x-session-id": session}, f"{session}-moved").primary == expected, session


def test_requests_without_a_session_id_are_not_bound() -> None:
    router = scorer_router([A, B])
    route(router, {})
    (scorer,) = [p for p in router.pipeline.pre_request_async if isinstance(p, SessionAffinityScorer)]
    assert scorer.core.bindings is not None and len(scorer.core.bindings.table) == 0


def test_bindings_expire_after_the_ttl_and_the_sweep_runs_on_its_period() -> None:
    clock = Clock()
    text = SESSION_SCORER.replace("{placement: %s}", "{evictionTtlSeconds: 30, evictionSweepSeconds: 5}")
    loaded = load(text, Services(clock=clock))
    router = router_for(loaded, [A, B])
    (scorer,) = [p for p in loaded.roles.tickers if isinstance(p, SessionAffinityScorer)]
    assert scorer.core.bindings is not None
    table = scorer.core.bindings.table
    for i in range(3):
        finish(router, route(router, {"x-session-id": f"s{i}"}, f"r{i}"))
    scorer.tick(clock.now)  # nothing is old yet
    assert len(table) == 3
    clock.now += 31
    scorer.tick(clock.now)
    assert len(table) == 0 and table.expired == 3


def test_the_session_id_may_come_from_the_agent_identity_attribute() -> None:
    text = """
    plugins:
    - type: agent-identity
    - type: session-affinity-filter
      parameters:
        strategy: session_id
        sessionIdConfig:
          sources: [{header: x-session-id}, {attribute: agent-identity}]
    - type: random-picker
    schedulingProfiles:
    - name: default
      plugins: [{pluginRef: session-affinity-filter}, {pluginRef: random-picker}]
    """
    router = router_for(load(text), [A, B, C])
    first = route(router, {"x-claude-code-session-id": "agent-1"})
    finish(router, first)
    for i in range(10):
        assert route(router, {"x-claude-code-session-id": "agent-1"}, f"r{i}").primary == first.primary
    # the header source comes first: a session id overrides the agent identity
    other = route(router, {"x-session-id": "s-x", "x-claude-code-session-id": "agent-1"}, "r-x")
    (flt,) = [p for p in router.pipeline.pre_request_async if isinstance(p, SessionAffinityFilter)]
    assert flt.core.bindings is not None and flt.core.bindings.table.peek("s-x") == other.primary.id


def test_the_filter_pins_hard_and_never_empties_the_pool() -> None:
    loaded = load("""
    plugins:
    - {type: session-affinity-filter, parameters: {strategy: session_id}}
    - {type: random-picker}
    schedulingProfiles:
    - name: default
      plugins: [{pluginRef: session-affinity-filter}, {pluginRef: random-picker}]
    """)
    (flt,) = [p for p in loaded.roles.filters if isinstance(p, SessionAffinityFilter)]
    router = router_for(loaded, [A, B, C])
    first = route(router, {"x-session-id": "s1"})
    finish(router, first)
    ctx = SchedulingContext(LLMRequest("f", "m", headers={"x-session-id": "s1"}), [A, B, C])
    asyncio.run(flt.produce_async(ctx))
    assert flt.filter(ctx, [A, B, C]) == [first.primary]
    rest = [e for e in (A, B, C) if e != first.primary]
    assert flt.filter(ctx, rest) == rest  # bound endpoint not a candidate: everyone passes
    unbound = SchedulingContext(LLMRequest("g", "m", headers={"x-session-id": "new"}), [A, B, C])
    asyncio.run(flt.produce_async(unbound))
    assert flt.filter(unbound, [A, B, C]) == [A, B, C]


# --- encoded_endpoint_header strategy ---------------------------------------------------------


def token(endpoint: Endpoint) -> str:
    return base64.b64encode((endpoint.name or endpoint.id).encode()).decode()


def test_the_token_names_the_endpoint_and_the_response_carries_the_servers_token() -> None:
    scorer = SessionAffinityScorer("s")
    ctx = SchedulingContext(LLMRequest("r", "m", headers={"x-session-token": token(B)}), [A, B])
    asyncio.run(scorer.produce_async(ctx))
    assert scorer.score(ctx, [A, B]) == {A.id: 0.0, B.id: 1.0}
    router = router_for(load("plugins: [{type: session-affinity-scorer}, {type: random-picker}]\n"), [A, B])
    decision = route(router, {})
    (plugin,) = [p for p in router.pipeline.pre_request_async if isinstance(p, SessionAffinityScorer)]
    headers = plugin.response_headers(decision.ctx, decision.result, decision.primary.id)
    assert headers == [("x-session-token", token(decision.primary))]
    assert base64.b64decode(headers[0][1]).decode() == decision.primary.name
    unnamed = Endpoint("10.0.0.9", 9000)
    assert token(unnamed) == base64.b64encode(b"10.0.0.9:9000").decode()


@pytest.mark.parametrize("value", ["not base64!", base64.b64encode(b"\xff\xfe").decode(), "x" * 5000])
def test_a_token_that_does_not_decode_expresses_no_preference(value: str) -> None:
    flt = SessionAffinityFilter("f")
    ctx = SchedulingContext(LLMRequest("r", "m", headers={"x-session-token": value}), [A, B])
    asyncio.run(flt.produce_async(ctx))
    assert flt.filter(ctx, [A, B]) == [A, B]


def test_a_custom_token_header_is_matched_lowercased() -> None:
    loaded = load("""
    plugins:
    - {type: session-affinity-filter, parameters: {encodedEndpointHeaderConfig: {header: X-Session-Token-Prefill}}}
    - {type: random-picker}
    schedulingProfiles:
    - name: default
      plugins: [{pluginRef: session-affinity-filter}, {pluginRef: random-picker}]
    """)
    router = router_for(loaded, [A, B, C])
    for i in range(5):
        assert route(router, {"x-session-token-prefill": token(C)}, f"r{i}").primary == C


# --- configuration ---------------------------------------------------------------------------


def test_session_id_config_under_the_default_strategy_is_a_warning() -> None:
    loaded = load("plugins: [{type: session-affinity-scorer, parameters: {sessionIdConfig: {evictionTtlSeconds: 60}}},"
                  " {type: random-picker}]\n")  # fmt: skip
    assert any("sessionIdConfig" in w and "strategy: session_id" in w for w in loaded.warnings)


@pytest.mark.parametrize(
    ("params", "path", "message"),
    [
        ("{strategy: sticky}", "parameters.strategy", "must be one of"),
        ("{strategy: session_id, sessionIdConfig: {sources: [{header: a, attribute: b}]}}",
         "sessionIdConfig.sources[0]", "exactly one of header or attribute"),
        ("{strategy: session_id, sessionIdConfig: {sources: [{}]}}", "sessionIdConfig.sources[0]", "exactly one"),
        ("{strategy: session_id, sessionIdConfig: {evictionTtlSeconds: -1}}", "evictionTtlSeconds", "must be > 0"),
        ("{strategy: session_id, sessionIdConfig: {sharedStore: {address: 'valkey:6379'}}}",
         "sharedStore.address", "redis://"),
        ("{strategy: session_id, sessionIdConfig: {ttl: 5}}", "sessionIdConfig.ttl", "unknown key"),
    ],
)
def test_bad_parameters_name_the_field(params: str, path: str, message: str) -> None:
    error = config_error(epp(f"plugins: [{{type: session-affinity-filter, parameters: {params}}}, {{type: random-picker}}]\n"))
    assert error.path.endswith(path) and message in str(error), str(error)


@pytest.mark.parametrize(("weight", "warned"), [(10, True), (18, True), (19, False)])
def test_a_session_weight_the_other_scorers_can_outvote_is_a_load_warning(weight: int, warned: bool) -> None:
    # bound 1.0 and runner-up 0.5: a margin of weight / 2 against the others' 9 in all
    text = f"""
    plugins:
    - {{type: session-affinity-scorer, parameters: {{strategy: session_id, sessionIdConfig: {{placement: fewestBindings}}}}}}
    - {{type: active-request-scorer}}
    - {{type: kv-cache-utilization-scorer}}
    - {{type: max-score-picker}}
    schedulingProfiles:
    - name: default
      plugins:
      - {{pluginRef: session-affinity-scorer, weight: {weight}}}
      - {{pluginRef: active-request-scorer, weight: 5}}
      - {{pluginRef: kv-cache-utilization-scorer, weight: 4}}
    """
    warnings = [w for w in load(text).warnings if "session-affinity-scorer" in w]
    assert bool(warnings) is warned, warnings
    if warned:
        assert f"weight {weight} and the other scorers 9" in warnings[0] and "above 18" in warnings[0]


def test_the_labs_session_config_keeps_sessions_on_their_endpoint_without_warnings() -> None:
    from ppc_extproc_lab.localcluster.sessions import session_cluster_config

    loaded = load_config_text(yaml.safe_dump(session_cluster_config(None)))
    assert loaded.warnings == []


class BlockingHook(AsyncPreRequest):
    """An awaited pre-request hook that never returns (a store that hangs past every bound)."""

    name = type_name = "blocking-hook"

    def __init__(self) -> None:
        self.entered = asyncio.Event()

    async def pre_request_async(self, ctx: SchedulingContext, result: SchedulingResult) -> None:
        self.entered.set()
        await asyncio.Event().wait()


def test_a_request_cancelled_in_an_awaited_pre_request_hook_releases_what_routing_started() -> None:
    router = scorer_router([A, B], placement="fewestBindings")
    hook = BlockingHook()
    router.pipeline.pre_request_async.append(hook)

    async def scenario() -> None:
        task = asyncio.create_task(router.route(LLMRequest("r1", "m", headers={"x-session-id": "s1"})))
        await asyncio.wait_for(hook.entered.wait(), 5)
        assert router.inflight.requests(A.id) + router.inflight.requests(B.id) == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert len(router.inflight) == 0
        assert router.inflight.requests(A.id) + router.inflight.requests(B.id) == 0

    asyncio.run(scenario())
