"""Replay against a ROUTER that behaves like vLLM's: gaps, first contact, restarts, failures."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import zmq
from kv_transport_helpers import (
    Publisher,
    ReplayRouter,
    bad_frames,
    free_port,
    holds,
    wait_until,
)
from kv_transport_wire import chain

from ppc_extproc.events.apply import EventApplier
from ppc_extproc.events.transport import ReplayPolicy, TransportTuning


@pytest.fixture(params=["new", "old"])
def engine(request: pytest.FixtureRequest, zctx: zmq.Context[Any]) -> Iterator[tuple[Publisher, ReplayRouter]]:
    """A publisher on 127.0.3.N with its replay ROUTER (new form with topic, or old form)."""
    ip = f"127.0.3.{1 if request.param == 'new' else 2}"
    pub = Publisher(zctx, ip)
    router = ReplayRouter(zctx, pub, free_port(ip), form=request.param)
    yield pub, router
    router.close()
    pub.close()


def count(applier: EventApplier, pub: Publisher, name: str) -> int:
    return int(applier.stats.transport.get((pub.endpoint_id, name), 0))


def subscribe(make_transport: Any, pub: Publisher, router: ReplayRouter, **kw: Any) -> Any:
    replay_port = int(router.sock.getsockopt_string(zmq.LAST_ENDPOINT).rsplit(":", 1)[1])
    transport = make_transport(socket_port=pub.port, replay_port=replay_port, **kw)
    transport.add_endpoint(pub.endpoint)
    pub.wait_subscribed()
    return transport


def test_gap_is_filled_by_replay_in_order(
    engine: tuple[Publisher, ReplayRouter], applier: EventApplier, make_transport: Any
) -> None:
    pub, router = engine
    subscribe(make_transport, pub, router)
    wait_until(
        lambda: count(applier, pub, "replays_ok") == 1,
        what="replay on connect",
        context=lambda: (applier.stats.snapshot(), router.requests),
    )
    b0, t0 = chain(0xA0, 2, 1)
    b1, t1 = chain(0xB0, 2, 1000, parent=0xA1)
    b2, t2 = chain(0xC0, 2, 2000, parent=0xB1)
    pub.send(b0)
    pub.skip(b1)  # lost on the way; the engine still has it
    pub.send(b2)
    tokens = t0 + t1 + t2
    # b2's parent is in b1: only an in-order replay of b1 makes b2 indexable.
    wait_until(lambda: holds(applier, pub.endpoint_id, tokens) == 6, what="chain through the gap")
    wait_until(lambda: count(applier, pub, "held_duplicates") == 1, what="held copy dropped")
    assert router.requests == [0, 1]
    assert count(applier, pub, "gaps") == 1
    assert count(applier, pub, "replays_ok") == 2
    assert count(applier, pub, "replayed") == 2  # seq 1 and 2; the held live seq 2 is dropped
    assert count(applier, pub, "held_duplicates") == 1
    assert applier.stats.dropped.get((pub.endpoint_id, "unknown_parent"), 0) == 0


def test_live_messages_held_during_a_replay_are_applied_after_it(
    engine: tuple[Publisher, ReplayRouter], applier: EventApplier, make_transport: Any
) -> None:
    pub, router = engine
    transport = subscribe(make_transport, pub, router)
    wait_until(
        lambda: count(applier, pub, "replays_ok") == 1,
        what="replay on connect",
        context=lambda: (applier.stats.snapshot(), router.requests),
    )
    router.delay = 0.3
    parent: int | None = None
    tokens: list[int] = []
    payloads = []
    for i in range(8):
        payload, toks = chain(0x100 + 2 * i, 2, 1 + 32 * i, parent)
        payloads.append(payload)
        parent, tokens = 0x100 + 2 * i + 1, tokens + toks
    pub.send(payloads[0])
    pub.skip(payloads[1])
    pub.send(payloads[2])  # gap ⇒ replay (answered after 0.3 s)
    wait_until(lambda: transport.sources()[0].replaying, what="replay running")
    for payload in payloads[3:]:
        pub.send(payload)  # held
    wait_until(lambda: transport.sources()[0].queue_depth == 6, what="6 messages held")
    wait_until(lambda: holds(applier, pub.endpoint_id, tokens) == 16, what="everything in order")
    wait_until(lambda: transport.sources()[0].queue_depth == 0, what="hold emptied")
    state = transport.sources()[0]
    assert state.last_seq == 7 and not state.replaying


def test_first_contact_mid_stream_replays_from_zero(
    engine: tuple[Publisher, ReplayRouter], applier: EventApplier, make_transport: Any
) -> None:
    """The engine published before we subscribed: without a replay on connect, the first live
    message (seq 3) triggers a full replay."""
    pub, router = engine
    no_connect_replay = TransportTuning(
        replay=ReplayPolicy(idle_timeout_seconds=0.3, max_attempts=2, replay_on_connect=False),
        poll_interval_seconds=0.01,
    )
    parent: int | None = None
    tokens: list[int] = []
    for i in range(3):
        payload, toks = chain(0x200 + 2 * i, 2, 1 + 32 * i, parent)
        pub.skip(payload)  # published before anyone listened
        parent, tokens = 0x200 + 2 * i + 1, tokens + toks
    subscribe(make_transport, pub, router, tuning=no_connect_replay)
    payload, toks = chain(0x206, 2, 97, parent)
    pub.send(payload)
    tokens += toks
    wait_until(lambda: holds(applier, pub.endpoint_id, tokens) == 8, what="history replayed")
    assert router.requests == [0]


def test_replay_on_connect_indexes_an_idle_engine(
    engine: tuple[Publisher, ReplayRouter], applier: EventApplier, make_transport: Any
) -> None:
    """llm-d replays from 0 on connect: an engine that published before we started and is now
    idle is indexed anyway. (Old-form replies carry no topic: the model is unknown until a live
    message arrives, so nothing is indexed from them, by design.)"""
    pub, router = engine
    payload, tokens = chain(0x300, 3, 1)
    pub.skip(payload)
    subscribe(make_transport, pub, router)
    if router.form == "new":
        wait_until(lambda: holds(applier, pub.endpoint_id, tokens) == 3, what="replayed on connect")
    else:
        wait_until(lambda: count(applier, pub, "replay_topic_unknown") == 1, what="replay skipped")
        assert holds(applier, pub.endpoint_id, tokens) == 0
        pub.send(chain(0x400, 1, 5000)[0])  # seq 1 after nothing applied ⇒ full replay
        wait_until(lambda: holds(applier, pub.endpoint_id, tokens) == 3, what="replayed after live")


def test_restart_clears_then_replay_refills(
    engine: tuple[Publisher, ReplayRouter], applier: EventApplier, make_transport: Any
) -> None:
    pub, router = engine
    subscribe(make_transport, pub, router)
    old, old_tokens = chain(0xA0, 2, 1)
    for _ in range(4):
        pub.send(old)
    wait_until(lambda: count(applier, pub, "batches") == 4, what="4 batches")
    assert holds(applier, pub.endpoint_id, old_tokens) == 2

    pub.restart()  # new engine: seq from 0, empty replay buffer, publishes before we reconnect
    new, new_tokens = chain(0xD0, 2, 5000)
    for _ in range(6):
        pub.skip(new)  # seq 0..5, none seen live; seq 3 differs from the seq 3 we applied
    pub.probe_until(lambda: bad_frames(applier, pub))
    wait_until(lambda: holds(applier, pub.endpoint_id, new_tokens) == 2, what="new engine replayed")
    assert holds(applier, pub.endpoint_id, old_tokens) == 0
    assert count(applier, pub, "restarts_detected") == 1
    assert count(applier, pub, "reconnects") == 1


def test_reconnect_to_the_same_publisher_is_verified_not_cleared(
    engine: tuple[Publisher, ReplayRouter], applier: EventApplier, make_transport: Any
) -> None:
    pub, router = engine
    subscribe(make_transport, pub, router)
    a, tokens_a = chain(0xA0, 2, 1)
    pub.send(a)
    wait_until(lambda: holds(applier, pub.endpoint_id, tokens_a) == 2, what="first blocks")
    pub.restart(keep_seq=True)
    with pub.lock:
        pub.buffer.append((0, a))  # same engine: its replay buffer still has seq 0
    b, tokens_b = chain(0xB0, 2, 3000, parent=0xA1)
    pub.skip(b)  # seq 1, published while we were disconnected
    pub.probe_until(lambda: bad_frames(applier, pub))
    wait_until(lambda: holds(applier, pub.endpoint_id, tokens_a + tokens_b) == 4, what="caught up")
    assert count(applier, pub, "resyncs_verified") == 1
    assert count(applier, pub, "restarts_detected") == 0
    assert router.requests[-1] == 0  # VERIFY asks from last (0)


def test_failed_replay_cools_down_and_applies_what_was_held(
    zctx: zmq.Context[Any], applier: EventApplier, make_transport: Any
) -> None:
    pub = Publisher(zctx, "127.0.3.9")
    router = ReplayRouter(zctx, pub, free_port("127.0.3.9"))
    router.mute = True
    transport = subscribe(make_transport, pub, router)
    wait_until(lambda: count(applier, pub, "replays_failed") == 1, what="connect replay failed")
    pub.send(chain(0xA0, 1, 1)[0])
    pub.skip(chain(0xB0, 1, 100)[0])
    c, tokens_c = chain(0xC0, 1, 200)
    pub.send(c)
    wait_until(lambda: holds(applier, pub.endpoint_id, tokens_c) == 1, what="applied during cool-down")
    assert count(applier, pub, "gaps") == 1
    assert count(applier, pub, "replays_failed") == 1  # cooling down: no second attempt yet
    # After the cool-down (0.5 s) a gap is replayed again; the ROUTER answers now.
    router.mute = False
    before = count(applier, pub, "replays_ok")
    deadline = time.monotonic() + 5.0
    while count(applier, pub, "replays_ok") == before:
        assert time.monotonic() < deadline, "no replay after the cool-down"
        pub.skip(chain(0xD0, 1, 300)[0])  # one more gap per round
        pub.send(chain(0xE0, 1, 400)[0])
        assert transport.wait_idle(2.0)
    assert holds(applier, pub.endpoint_id, chain(0xD0, 1, 300)[1]) == 1
    router.close()
    pub.close()


def test_full_hold_drops_then_resynchronises_by_replay(
    engine: tuple[Publisher, ReplayRouter], applier: EventApplier, make_transport: Any
) -> None:
    pub, router = engine
    transport = subscribe(make_transport, pub, router, queue_size=4)
    wait_until(
        lambda: count(applier, pub, "replays_ok") == 1,
        what="replay on connect",
        context=lambda: (applier.stats.snapshot(), router.requests),
    )
    router.delay = 0.3
    parent: int | None = None
    tokens: list[int] = []
    payloads = []
    for i in range(20):
        payload, toks = chain(0x500 + i, 1, 1 + 16 * i, parent)
        payloads.append(payload)
        parent, tokens = 0x500 + i, tokens + toks
    pub.send(payloads[0])
    pub.skip(payloads[1])
    for payload in payloads[2:]:
        pub.send(payload)  # one triggers the replay, 4 are held, the rest overflow
    wait_until(
        lambda: holds(applier, pub.endpoint_id, tokens) == 20,
        what="resynchronised",
        context=lambda: (applier.stats.snapshot(), router.requests, transport.sources()),
    )
    assert count(applier, pub, "queue_overflow") > 0
    assert transport.sources()[0].last_seq == 19


def test_an_unanswered_attempt_is_retried(
    engine: tuple[Publisher, ReplayRouter], applier: EventApplier, make_transport: Any
) -> None:
    pub, router = engine
    router.ignore = 1  # the first request (on connect) goes unanswered
    payload, tokens = chain(0x600, 2, 1)
    pub.skip(payload)
    pub.send(chain(0x610, 1, 100)[0])
    subscribe(make_transport, pub, router)
    wait_until(lambda: count(applier, pub, "replays_ok") >= 1, what="replay after a retry")
    assert count(applier, pub, "replay_retries") >= 1 and count(applier, pub, "replays_failed") == 0
    assert router.requests[:2] == [0, 0]
    if router.form == "new":
        assert holds(applier, pub.endpoint_id, tokens) == 2


def test_concurrent_replays_are_bounded(zctx: zmq.Context[Any], applier: EventApplier, make_transport: Any) -> None:
    one_at_a_time = TransportTuning(
        replay=ReplayPolicy(idle_timeout_seconds=2.0, max_concurrent=1),
        poll_interval_seconds=0.01,
    )
    pubs = [Publisher(zctx, "127.0.3.20")]
    pubs += [Publisher(zctx, f"127.0.3.{i}", pubs[0].port) for i in (21, 22)]
    replay_port = free_port("127.0.3.20")
    routers = [ReplayRouter(zctx, pub, replay_port) for pub in pubs]
    tokens = {}
    for k, (pub, router) in enumerate(zip(pubs, routers, strict=True)):
        router.delay = 0.2
        payload, tokens[pub.endpoint_id] = chain(0x700 + 16 * k, 2, 1 + 100 * k)
        pub.skip(payload)
    transport = make_transport(socket_port=pubs[0].port, replay_port=replay_port, tuning=one_at_a_time)
    for pub in pubs:
        transport.add_endpoint(pub.endpoint)
    for pub in pubs:
        wait_until(lambda: holds(applier, pub.endpoint_id, tokens[pub.endpoint_id]) == 2, what="replayed")
    spans = sorted((r.arrived[0], r.answered[0]) for r in routers)
    for (_, done), (start, _) in zip(spans, spans[1:], strict=False):
        assert start >= done - 0.01, "a replay started while another was running"
    for router, pub in zip(routers, pubs, strict=True):
        router.close()
        pub.close()
