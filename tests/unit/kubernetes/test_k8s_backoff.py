"""The watch client's backoff: client-go's 800 ms doubling to 30 s, jitter 1.0, reset after 2 min."""

from __future__ import annotations

from ppc_extproc.discovery.kubernetes.client import Backoff, BackoffPolicy, Resource


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_delays_double_to_the_cap_and_jitter_adds_up_to_the_delay_again() -> None:
    clock = Clock()
    none = Backoff(BackoffPolicy(), rng=lambda: 0.0, clock=clock)
    assert [round(none.delay(), 3) for _ in range(8)] == [0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 30.0, 30.0]
    full = Backoff(BackoffPolicy(), rng=lambda: 1.0, clock=clock)
    assert [round(full.delay(), 3) for _ in range(3)] == [1.6, 3.2, 6.4]
    half = Backoff(BackoffPolicy(jitter=0.5), rng=lambda: 1.0, clock=clock)
    assert round(half.delay(), 3) == 1.2


def test_a_quiet_period_resets_the_backoff() -> None:
    clock = Clock()
    backoff = Backoff(BackoffPolicy(), rng=lambda: 0.0, clock=clock)
    backoff.delay()
    backoff.delay()
    clock.now += 119
    assert round(backoff.delay(), 3) == 3.2
    clock.now += 121
    assert round(backoff.delay(), 3) == 0.8


def test_resource_paths_and_rbac_names() -> None:
    pods = Resource("", "v1", "pods", "llm")
    pools = Resource("inference.networking.k8s.io", "v1", "inferencepools", "llm")
    assert pods.path() == "/api/v1/namespaces/llm/pods" and pods.describe() == "pods"
    assert pools.path() == "/apis/inference.networking.k8s.io/v1/namespaces/llm/inferencepools"
    assert pools.describe() == "inferencepools.inference.networking.k8s.io"
