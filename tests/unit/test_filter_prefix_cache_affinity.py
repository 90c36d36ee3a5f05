"""prefix-cache-affinity-filter: threshold, TTFT gate, exploration."""

from __future__ import annotations

import random

import pytest

from ppc_extproc.errors import ConfigError
from ppc_extproc.framework import (
    IN_FLIGHT_LOAD,
    PREFIX_CACHE_MATCH_INFO,
    Consumes,
    Endpoint,
    LLMRequest,
    SchedulingContext,
)
from ppc_extproc.framework.params import Section
from ppc_extproc.matchinfo import PrefixCacheMatchInfo
from ppc_extproc.plugins.filters import PrefixCacheAffinityFilter
from ppc_extproc.plugins.producers.inflight_load import InflightLoadProducer
from ppc_extproc.plugins.registry import Services
from ppc_extproc.scheduling.inflight import InflightTracker

A, B, C = Endpoint("10.0.0.1", 8000), Endpoint("10.0.0.2", 8000), Endpoint("10.0.0.3", 8000)
KEY = PREFIX_CACHE_MATCH_INFO.of("p")


class FixedRandom(random.Random):
    def __init__(self, value: float) -> None:
        super().__init__()
        self.value = value
        self.calls = 0

    def random(self) -> float:
        self.calls += 1
        return self.value


#: filter → the in-flight load its producer writes into each request (``run``).
_LOAD: dict[PrefixCacheAffinityFilter, InflightTracker] = {}


def make(inflight: InflightTracker | None = None, **kwargs: object) -> PrefixCacheAffinityFilter:
    f = PrefixCacheAffinityFilter("f", producer_name="p", **kwargs)  # type: ignore[arg-type]
    _LOAD[f] = inflight if inflight is not None else InflightTracker()
    return f


def ctx(ratios: dict[Endpoint, tuple[int, int]]) -> SchedulingContext:
    c = SchedulingContext(LLMRequest("r", "m"), list(ratios))
    for e, (match, total) in ratios.items():
        c.put_endpoint_value(e.id, KEY, PrefixCacheMatchInfo(match, total, 64))
    return c


def run(f: PrefixCacheAffinityFilter, c: SchedulingContext) -> tuple[list[Endpoint], str]:
    InflightLoadProducer(f.load_key.producer, _LOAD[f]).produce(c)
    kept = f.filter(c, list(c.candidates))
    why = c.get(f.decision_key)
    assert why is not None
    return kept, why


def test_keeps_endpoints_at_or_above_the_threshold() -> None:
    kept, why = run(make(), ctx({A: (8, 10), B: (7, 10), C: (10, 10)}))
    assert kept == [A, C] and why == "sticky"


def test_nobody_sticky_keeps_all() -> None:
    kept, why = run(make(), ctx({A: (1, 10), B: (0, 10)}))
    assert kept == [A, B] and why == "no_match"


def test_missing_match_info_counts_as_zero() -> None:
    c = SchedulingContext(LLMRequest("r", "m"), [A, B])
    c.put_endpoint_value(A.id, KEY, PrefixCacheMatchInfo(10, 10, 64))
    assert run(make(), c)[0] == [A]


def test_single_candidate_or_zero_threshold_is_not_applicable() -> None:
    assert run(make(), ctx({A: (0, 10)})) == ([A], "not_applicable")
    assert run(make(affinity_threshold=0.0), ctx({A: (10, 10), B: (0, 10)}))[1] == "not_applicable"


def test_ttft_gate_breaks_stickiness_when_the_sticky_endpoint_is_too_busy() -> None:
    inflight = InflightTracker()
    f = make(inflight, max_ttft_penalty_ms=1000.0, peak_prefill_throughput=1000.0)
    inflight.start("busy", A.id, 1500)  # A: 1500 ms estimated TTFT; B idle ⇒ penalty 1500 > 1000
    kept, why = run(f, ctx({A: (10, 10), B: (0, 10)}))
    assert kept == [A, B] and why == "load_override"
    inflight.finish("busy")
    inflight.start("less", A.id, 900)  # penalty 900 ≤ 1000 ⇒ stick
    assert run(f, ctx({A: (10, 10), B: (0, 10)})) == ([A], "sticky")


def test_ttft_gate_uses_the_best_of_each_group() -> None:
    inflight = InflightTracker()
    inflight.start("1", A.id, 5000)
    inflight.start("2", C.id, 5000)  # the non-sticky group's best is C at 5000 ms
    f = make(inflight, max_ttft_penalty_ms=1000.0, peak_prefill_throughput=1000.0)
    kept, why = run(f, ctx({A: (10, 10), B: (10, 10), C: (0, 10)}))
    assert kept == [A, B] and why == "sticky"  # best sticky B: 0 ms


def test_zero_penalty_always_sticks() -> None:
    inflight = InflightTracker()
    inflight.start("busy", A.id, 10**9)
    assert run(make(inflight, max_ttft_penalty_ms=0.0), ctx({A: (10, 10), B: (0, 10)}))[0] == [A]


def test_exploration_skips_the_filter_with_its_probability() -> None:
    hit = FixedRandom(0.05)
    f = make(exploration_probability=0.1, rng=hit)
    assert run(f, ctx({A: (10, 10), B: (0, 10)})) == ([A, B], "exploration")
    miss = FixedRandom(0.5)
    assert run(make(exploration_probability=0.1, rng=miss), ctx({A: (10, 10), B: (0, 10)}))[0] == [A]
    never = FixedRandom(0.0)
    run(make(rng=never), ctx({A: (10, 10), B: (0, 10)}))
    assert never.calls == 0  # probability 0: no draw at all


def test_exploration_rate_with_a_seeded_rng() -> None:
    f = make(exploration_probability=0.25, rng=random.Random(7))
    explored = sum(run(f, ctx({A: (10, 10), B: (0, 10)}))[1] == "exploration" for _ in range(4000))
    assert 850 < explored < 1150


def test_parameters_defaults_and_validation() -> None:
    services = Services()
    f = PrefixCacheAffinityFilter.from_parameters("f", Section({}, "p"), services)
    assert (f.affinity_threshold, f.exploration_probability, f.max_ttft_penalty_ms, f.peak_prefill_throughput) == (
        0.80, 0.0, 18000.0, 15928.0,
    )
    assert f.match_key == PREFIX_CACHE_MATCH_INFO.of("approx-prefix-cache-producer")
    assert f.consumes()[1] == Consumes(IN_FLIGHT_LOAD, "inflight-load-producer")
    for bad in ({"affinityThreshold": 1.5}, {"explorationProbability": -0.1}, {"maxTTFTPenaltyMs": -1},
                {"peakPrefillThroughput": 0}, {"ttftSource": "latencyPredictor"},
                {"prefillCalibrationFile": "/x"}, {"affinity": 1}):
        with pytest.raises(ConfigError):
            section = Section(bad, "p")
            PrefixCacheAffinityFilter.from_parameters("f", section, Services())
            section.finish()
    ok = Section({"peakPrefillThroughput": 0, "maxTTFTPenaltyMs": 0, "ttftSource": "prefillThroughput",
                  "inFlightLoadProducerName": "x", "prefixMatchInfoProducerName": "p"}, "p")
    assert PrefixCacheAffinityFilter.from_parameters("f", ok, Services()).producer_name == "p"
    ok.finish()
