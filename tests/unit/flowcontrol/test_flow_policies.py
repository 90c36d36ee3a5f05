"""Each flow-control plugin's documented behaviour (the READMEs under ``llm-d/llm-d-router:
pkg/epp/framework/plugins/flowcontrol/`` and ``.../requestcontrol/admitter/probabilisticadmitter/``)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
from epp_helpers import config_error, epp, load

from ppc_extproc.enginemetrics import EngineMetrics, EngineMetricsStore
from ppc_extproc.flowcontrol.admission import fairness_id, slo_ttft_seconds
from ppc_extproc.flowcontrol.types import FlowItem
from ppc_extproc.framework import Endpoint, LLMRequest, SchedulingContext
from ppc_extproc.ids import EndpointId
from ppc_extproc.plugins.flowcontrol.admitter import ProbabilisticAdmitter, ProbabilisticAdmitterConfig
from ppc_extproc.plugins.flowcontrol.detectors import ConcurrencyDetector, UtilizationConfig, UtilizationDetector
from ppc_extproc.plugins.flowcontrol.fairness import GlobalStrictFairness, RoundRobinFairness
from ppc_extproc.plugins.flowcontrol.ordering import EdfOrdering, FcfsOrdering, SloDeadlineOrdering
from ppc_extproc.plugins.flowcontrol.program_aware import ProgramAwareConfig, ProgramAwareFairness
from ppc_extproc.plugins.flowcontrol.usage_limits import (
    HoldbackConfig,
    PriorityHoldbackPolicy,
    SoftReflectiveCeilingPolicy,
    StaticUsageLimitPolicy,
)
from ppc_extproc.scheduling.inflight import InflightTracker
from ppc_extproc.tokens import TokenizedPrompt

A, B = EndpointId("10.0.0.1:8000"), EndpointId("10.0.0.2:8000")


def item(rid: str, enqueued: float, *, flow: str = "f", ttl: float = 0.0, received: float | None = None,
         slo: float | None = None, seq: int = 0) -> FlowItem:
    return FlowItem(rid, flow, 0, 10, enqueued if received is None else received, enqueued, ttl, slo, seq=seq)


@dataclass
class Flow:
    flow_id: str
    items: list[FlowItem]

    @property
    def head(self) -> FlowItem:
        return self.items[0]

    def __len__(self) -> int:
        return len(self.items)


# --- fairness ---------------------------------------------------------------------------------------


def test_global_strict_picks_the_flow_with_the_best_head_by_the_ordering() -> None:
    flows = [Flow("a", [item("a1", 5.0, seq=2)]), Flow("b", [item("b1", 3.0, seq=1)])]
    assert GlobalStrictFairness("g").pick(0, flows, FcfsOrdering("o")).flow_id == "b"
    # EDF: a's deadline (5 + 1) is earlier than b's (no TTL: never)
    flows = [Flow("a", [item("a1", 5.0, ttl=1.0)]), Flow("b", [item("b1", 3.0)])]
    assert GlobalStrictFairness("g").pick(0, flows, EdfOrdering("o")).flow_id == "a"


def test_round_robin_cycles_sorted_flows_per_band_and_skips_absent_ones() -> None:
    rr = RoundRobinFairness("rr")
    flows = [Flow(f, [item(f, 0.0)]) for f in ("c", "a", "b")]
    picks = [rr.pick(0, flows, FcfsOrdering("o")).flow_id for _ in range(4)]
    assert picks == ["a", "b", "c", "a"]
    assert rr.pick(1, flows, FcfsOrdering("o")).flow_id == "a"  # another band has its own cursor
    assert rr.pick(0, [flows[0], flows[1]], FcfsOrdering("o")).flow_id == "c"  # after 'a': b is gone


def program_aware(now: list[float], **params: object) -> ProgramAwareFairness:
    config = ProgramAwareConfig(**params)  # type: ignore[arg-type]
    return ProgramAwareFairness("pa", config, clock=lambda: now[0])


def test_program_aware_prefers_the_least_served_program() -> None:
    now = [100.0]
    pa = program_aware(now)
    pa.completed("heavy", 0, 1000, 500)  # 1000 + 2 × 500 = 2000 weighted tokens
    pa.completed("light", 0, 100, 0)
    assert pa.service("heavy") == pytest.approx(2000)
    flows = [Flow("heavy", [item("h", 99.0)]), Flow("light", [item("l", 99.9)])]
    assert pa.pick(0, flows, FcfsOrdering("o")).flow_id == "light"


def test_program_aware_breaks_equal_service_by_head_wait_and_decays_service() -> None:
    now = [100.0]
    pa = program_aware(now, half_life_seconds=60.0)
    flows = [Flow("new", [item("n", 99.0)]), Flow("old", [item("o", 90.0)])]
    assert pa.pick(0, flows, FcfsOrdering("o")).flow_id == "old"  # waited longer
    pa.completed("x", 0, 1000, 0)
    now[0] += 60.0
    assert pa.service("x") == pytest.approx(500)  # one half-life
    cumulative = program_aware(now, half_life_seconds=0.0)
    cumulative.completed("x", 0, 1000, 0)
    now[0] += 600.0
    assert cumulative.service("x") == 1000


def test_program_aware_in_uncached_prompt_tokens_charges_at_routing() -> None:
    now = [0.0]
    pa = program_aware(now, service_unit="uncachedPromptTokens")
    pa.charged("a", 0, 4000)
    pa.charged("b", 0, 0)  # a full cache hit costs nothing
    pa.completed("a", 0, 4000, 100)  # usage at completion is not counted again
    assert (pa.service("a"), pa.service("b")) == (4000, 0)
    llm_d = program_aware(now)
    llm_d.charged("a", 0, 4000)
    assert llm_d.service("a") == 0  # llm-d's unit counts only at completion


def test_program_aware_forgets_idle_programs() -> None:
    now = [0.0]
    pa = program_aware(now, eviction_ttl_seconds=10.0, eviction_sweep_seconds=1.0)
    pa.completed("idle", 0, 10, 0)
    pa.dispatched(item("busy", 0.0, flow="busy"))
    now[0] = 20.0
    pa.pick(0, [Flow("other", [item("x", 19.0)])], FcfsOrdering("o"))
    assert pa.service("idle") == 0 and len(pa) == 1  # 'busy' has a request in flight


def test_program_aware_parameters_are_checked() -> None:
    error = config_error(epp("plugins: [{type: program-aware-fairness, parameters: {evictionSweepSeconds: 0}}]\n"))
    assert error.path == "plugins[0].parameters.evictionSweepSeconds"
    error = config_error(epp("plugins: [{type: program-aware-fairness, parameters: {strategy: fifo}}]\n"))
    assert error.path == "plugins[0].parameters.strategy"


# --- ordering -------------------------------------------------------------------------------------


def test_orderings_sort_keys() -> None:
    early, late = item("e", 1.0, ttl=10.0), item("l", 2.0, ttl=1.0)
    assert FcfsOrdering("o").key(early) < FcfsOrdering("o").key(late)
    assert EdfOrdering("o").key(late) < EdfOrdering("o").key(early)  # deadline 3 before 11
    assert EdfOrdering("o").key(item("none", 0.0)) > EdfOrdering("o").key(early)
    slo = SloDeadlineOrdering("o")
    urgent = item("u", 5.0, received=4.0, slo=0.1)
    relaxed = item("r", 1.0, received=1.0, slo=10.0)
    assert slo.key(urgent) < slo.key(relaxed) < slo.key(item("n", 0.0))


@pytest.mark.parametrize(("headers", "expected"), [
    ({"x-llm-d-slo-ttft-ms": "250"}, 0.25), ({"x-slo-ttft-ms": "1000"}, 1.0),
    ({"x-llm-d-slo-ttft-ms": "soon"}, None), ({"x-llm-d-slo-ttft-ms": ""}, None), ({}, None),
])
def test_slo_header_parsing(headers: dict[str, str], expected: float | None) -> None:
    assert slo_ttft_seconds(headers) == expected


def test_fairness_id_header_or_default_flow() -> None:
    assert fairness_id({"x-llm-d-inference-fairness-id": "tenant-a"}) == "tenant-a"
    assert fairness_id({}) == "default-flow"
    assert len(fairness_id({"x-llm-d-inference-fairness-id": "x" * 10_000})) == 256


# --- usage limits -----------------------------------------------------------------------------------


def test_static_usage_limit_is_one_ceiling_for_all() -> None:
    assert StaticUsageLimitPolicy("s", 0.8).ceilings(0.5, [3, 0, -1]) == [0.8, 0.8, 0.8]
    assert config_error(epp("plugins: [{type: static-usage-limit-policy, parameters: {threshold: 0}}]\n")).path == (
        "plugins[0].parameters.threshold")


def test_priority_holdback_rank_and_value_domains() -> None:
    rank = PriorityHoldbackPolicy("h", HoldbackConfig(min_ceiling=0.4, max_ceiling=0.9))
    assert rank.ceilings(0.0, [10, 5, 0]) == pytest.approx([0.9, 0.65, 0.4])
    assert rank.ceilings(0.0, [7]) == [0.9]
    value = PriorityHoldbackPolicy("h", HoldbackConfig(domain="value", min_ceiling=0.2, max_ceiling=1.0))
    assert value.ceilings(0.0, [10, 9, 0]) == pytest.approx([1.0, 0.92, 0.2])
    error = config_error(epp("plugins: [{type: priority-holdback-policy}]\n"))
    assert error.path == "plugins[0].parameters.minCeiling" and "required" in error.message
    error = config_error(epp("plugins: [{type: priority-holdback-policy, parameters: {minCeiling: 1.0}}]\n"))
    assert error.path == "plugins[0].parameters.minCeiling"


def test_soft_reflective_ceiling_opens_lower_bands_one_call_in_a_period() -> None:
    policy = SoftReflectiveCeilingPolicy("s")
    assert policy.ceilings(0.3, [2, 1, 0]) == [1.0, 1.0, 1.0]  # 0.3 < 1 − 2·0.3/2 = 0.7
    assert policy.ceilings(0.99, [0]) == [1.0]  # one band: always open
    assert policy.ceilings(1.0, [1, 0]) == [1.0, 0.0]
    # saturation 0.75: period round(0.75 / 0.25) = 3 — the gated band opens on one call in three
    calls = [policy.ceilings(0.75, [1, 0])[1] for _ in range(9)]
    assert sum(calls) == 3 and calls[0:3].count(1.0) == 1
    assert config_error(epp("plugins: [{type: soft-reflective-ceiling-policy, parameters: {x: 1}}]\n")).path == (
        "plugins[0].parameters")


# --- saturation detectors ---------------------------------------------------------------------------


def utilization(now: list[float], **kwargs: object) -> tuple[UtilizationDetector, EngineMetricsStore, InflightTracker]:
    store = EngineMetricsStore(clock=lambda: now[0], stale_after_seconds=None)
    inflight = InflightTracker(clock=lambda: now[0])
    return UtilizationDetector("u", UtilizationConfig(**kwargs), store, inflight, clock=lambda: now[0]), store, inflight  # type: ignore[arg-type]


def metrics(waiting: int, kv: float, at: float, running: int = 0) -> EngineMetrics:
    return EngineMetrics(waiting, running, kv, None, None, updated_at=at)


def test_utilization_detector_is_the_mean_roofline_over_endpoints() -> None:
    now = [10.0]
    detector, store, _ = utilization(now)
    store.set(A, metrics(5, 0.2, 10.0))  # max(5/5, 0.2/0.8) = 1.0
    store.set(B, metrics(0, 0.4, 10.0))  # max(0, 0.5) = 0.5
    assert detector.saturation([A, B], {}, 0) == pytest.approx(0.75)
    assert detector.saturation([], {}, 0) == 1.0
    # in-flight credit: 5 routed to B since its scrape, 2 not yet routed (one per endpoint)
    assert detector.saturation([A, B], {B: 5}, 2) == pytest.approx(((5 + 1) / 5 + (5 + 1) / 5) / 2)


def test_utilization_counts_in_flight_requests_the_lagging_gauges_do_not_show_yet() -> None:
    """A's gauges (a step old) show 4 running, 0 waiting, but 9 requests are in flight there: it
    is full (4 + 5); B idle. The pool is at 0.5 with no credit at all, so dispatch continues, and
    the filter sends it to B."""
    now = [10.0]
    detector, store, inflight = utilization(now)
    store.set(A, metrics(0, 0.1, 10.0, running=4))
    store.set(B, metrics(0, 0.1, 10.0, running=4))
    assert detector.saturation([A, B], {}, 0) == pytest.approx((0.125 + 0.125) / 2)  # kv 0.1 / 0.8
    for i in range(9):
        inflight.start(f"a{i}", A)
    assert detector.saturation([A, B], {}, 0) == pytest.approx((1.0 + 0.125) / 2)
    for i in range(9):
        inflight.start(f"b{i}", B)
    assert detector.saturation([A, B], {}, 0) == pytest.approx(1.0)  # no endpoint has room: gated


def test_stale_metrics_fall_back_to_in_flight_accounting_not_to_saturated() -> None:
    now = [10.0]
    detector, store, inflight = utilization(now)
    store.set(A, metrics(0, 0.1, 10.0, running=8))  # seen running 8: capacity 8 + 5
    assert detector.saturation([A], {}, 0) == pytest.approx(0.125)
    now[0] = 11.0  # 1 s later: older than 200 ms
    for i in range(13):
        inflight.start(f"r{i}", A)
    assert detector.saturation([A], {}, 0) == pytest.approx(1.0)
    assert detector.stale_endpoints() == 1
    inflight.finish("r0")
    assert detector.saturation([A], {}, 0) < 1.0  # dispatch continues as requests finish
    closed, store2, _ = utilization(now, stale_metrics="saturated")
    store2.set(A, metrics(0, 0.0, 10.0))
    assert closed.saturation([A], {}, 0) == 1.0  # llm-d's fail-closed


def test_utilization_filter_drops_stale_and_over_limit_endpoints_but_never_all() -> None:
    now = [10.0]
    detector, store, _ = utilization(now, headroom=0.2)
    store.set(A, metrics(6, 0.5, 10.0))  # 6 ≤ 5 × 1.2
    store.set(B, metrics(7, 0.5, 10.0))  # 7 > 6
    ea, eb = Endpoint("10.0.0.1", 8000), Endpoint("10.0.0.2", 8000)
    ctx = SchedulingContext(LLMRequest("r", "m", TokenizedPrompt("m", ())), [ea, eb])
    assert detector.filter(ctx, [ea, eb]) == [ea]
    store.set(A, metrics(9, 0.5, 10.0))
    assert detector.filter(ctx, [ea, eb]) == [ea, eb]  # all over: fail open


def test_utilization_filter_drops_an_endpoint_whose_in_flight_requests_fill_it_since_its_scrape() -> None:
    """The scrape says A is idle, but requests routed since fill its slots and its queue: the
    filter sends the next one elsewhere (capacity: the most seen running plus the threshold)."""
    now = [10.0]
    detector, store, inflight = utilization(now)
    store.set(A, metrics(0, 0.1, 10.0, running=4))  # capacity 4 + 5
    store.set(B, metrics(0, 0.1, 10.0, running=4))
    ea, eb = Endpoint("10.0.0.1", 8000), Endpoint("10.0.0.2", 8000)
    ctx = SchedulingContext(LLMRequest("r", "m", TokenizedPrompt("m", ())), [ea, eb])
    for i in range(8):
        inflight.start(f"a{i}", A)
    assert detector.filter(ctx, [ea, eb]) == [ea, eb]  # 8 < 9: one waiting place left
    inflight.start("a8", A)
    assert detector.filter(ctx, [ea, eb]) == [eb]
    for i in range(9):
        inflight.start(f"b{i}", B)
    assert detector.filter(ctx, [ea, eb]) == [ea, eb]  # both full: fail open


def test_concurrency_detector_modes() -> None:
    inflight = InflightTracker()
    inflight.start("r1", A, tokens=500)
    inflight.start("r2", A, tokens=500)
    inflight.start("r3", B, tokens=0)
    assert ConcurrencyDetector("c", inflight, "requests", max_concurrency=2).saturation([A, B], {}, 1) == 1.0
    assert ConcurrencyDetector("c", inflight, "tokens", max_tokens=1000).saturation([A, B], {}, 0) == 0.5
    hybrid = ConcurrencyDetector("c", inflight, "hybrid", max_concurrency=4, max_tokens=1000)
    assert hybrid.saturation([A, B], {}, 0) == pytest.approx((max(2 / 4, 1.0) + max(1 / 4, 0.0)) / 2)
    ea, eb = Endpoint("10.0.0.1", 8000), Endpoint("10.0.0.2", 8000)
    ctx = SchedulingContext(LLMRequest("r", "m", TokenizedPrompt("m", ())), [ea, eb])
    assert ConcurrencyDetector("c", inflight, "requests", max_concurrency=2).filter(ctx, [ea, eb]) == [eb]


# --- probabilistic admitter ---------------------------------------------------------------------------


def test_probabilistic_admitter_curve_and_rules() -> None:
    store = EngineMetricsStore(stale_after_seconds=None)
    admitter = ProbabilisticAdmitter("p", ProbabilisticAdmitterConfig(), store, rng=lambda: 0.5)
    assert admitter.probability(0.15) == pytest.approx(0.0228, abs=1e-3)
    assert admitter.probability(0.30) == pytest.approx(0.729, abs=1e-3)
    assert admitter.probability(0.34) == 1.0
    assert math.isclose(admitter.probability((1 / 300) ** (1 / 5)), 1.0)  # full shed from ≈ 0.32
    assert admitter.admit(0, [A]) is None and admitter.admit(-1, []) is None  # critical; no endpoints
    assert admitter.admit(-1, [A]) is not None  # never scraped: counts 1.0
    store.set(A, metrics(0, 0.0, 0.0))
    assert admitter.admit(-1, [A]) is None
    store.set(A, metrics(2, 0.0, 0.0))  # saturation 0.4: certain rejection
    assert "saturation=0.400" in (admitter.admit(-1, [A]) or "")


def test_probabilistic_admitter_parameters_must_be_positive() -> None:
    error = config_error(epp("plugins: [{type: probabilistic-admitter, parameters: {power: 0}}]\n"))
    assert error.path == "plugins[0].parameters.power"
    loaded = load("plugins: [{type: probabilistic-admitter, parameters: {k: 1000}}, {type: max-score-picker}]\n")
    assert loaded.flow_control is not None and [a.name for a in loaded.flow_control.admitters] == ["probabilistic-admitter"]


def test_program_aware_exports_llm_d_s_families() -> None:
    now = [10.0]
    pa = program_aware(now, service_unit="uncachedPromptTokens")
    pa.dispatched(item("a1", 9.0, flow="a"))  # waited 1 s
    pa.dispatched(item("b1", 7.0, flow="b"))  # waited 3 s
    pa.charged("a", 0, 100)
    assert pa.fairness_index() == pytest.approx((1 + 3) ** 2 / (2 * (1 + 9)))
    families = {f.name: f for f in pa.families()}
    assert families["llm_d_epp_program_aware_jains_fairness_index"].samples[0].value == pytest.approx(0.8)
    waits = {s.labels["program_id"]: s.value for s in families["llm_d_epp_program_aware_avg_wait_time_milliseconds"].samples}
    assert waits == {"a": pytest.approx(1000.0), "b": pytest.approx(3000.0)}
    service = {s.labels["program_id"]: s.value
               for s in families["llm_d_epp_program_aware_attained_service_tokens"].samples}
    assert service == {"a": 100.0, "b": 0.0}
