"""In-flight prompt tokens end at the first response byte, the request count at the end."""

from __future__ import annotations

from ppc_extproc.ids import EndpointId
from ppc_extproc.scheduling.inflight import InflightTracker

E = EndpointId("10.0.0.1:8000")


def test_release_tokens_keeps_the_request_in_flight() -> None:
    tracker = InflightTracker()
    tracker.start("a", E, 100)
    tracker.start("b", E, 30)
    tracker.release_tokens("a")
    tracker.release_tokens("a")  # idempotent
    assert (tracker.tokens(E), tracker.requests(E)) == (30, 2)
    tracker.finish("a")
    assert (tracker.tokens(E), tracker.requests(E)) == (30, 1)
    tracker.finish("b")
    assert (tracker.tokens(E), tracker.requests(E)) == (0, 0)


def test_release_of_an_unknown_request_is_a_no_op() -> None:
    tracker = InflightTracker()
    tracker.release_tokens("nobody")
    assert tracker.snapshot() == {}
