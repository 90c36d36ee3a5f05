"""The ingestion thread's timers wake it when they are due, not a fixed-rate poll: with the poll
interval (the longest wait) set far beyond the test's timeouts, replay timeouts and socket
retries still fire, and an idle thread does not spin."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import zmq
from kv_transport_helpers import FAST, Publisher, ReplayRouter, free_port, pause_in_flight, wait_until
from kv_transport_wire import chain

from ppc_extproc.events.apply import EventApplier
from ppc_extproc.events.transport import ReplayPolicy
from ppc_extproc.framework import Endpoint

#: Only a due timer (or input) can end a wait shorter than this.
TIMERS_ONLY = replace(FAST, poll_interval_seconds=60.0, log_interval_seconds=10.0)


def _count(applier: EventApplier, endpoint: str, name: str) -> int:
    return int(applier.stats.transport.get((endpoint, name), 0))


def test_replay_attempts_time_out_without_a_periodic_poll(
    zctx: zmq.Context[Any], applier: EventApplier, make_transport: Any
) -> None:
    pub = Publisher(zctx, "127.0.6.1")
    router = ReplayRouter(zctx, pub, free_port("127.0.6.1"))
    router.mute = True
    replay_port = int(router.sock.getsockopt_string(zmq.LAST_ENDPOINT).rsplit(":", 1)[1])
    tuning = replace(TIMERS_ONLY, replay=ReplayPolicy(idle_timeout_seconds=0.3, max_attempts=2, cooldown_seconds=0.5))
    transport = make_transport(socket_port=pub.port, replay_port=replay_port, tuning=tuning)
    transport.add_endpoint(pub.endpoint)
    pub.wait_subscribed()
    wait_until(lambda: _count(applier, pub.endpoint_id, "replays_failed") == 1, timeout=10, what="replay failed")
    assert _count(applier, pub.endpoint_id, "replay_retries") == 1
    assert len(router.requests) == 2
    router.close()
    pub.close()


def test_a_failed_bind_is_retried_without_a_periodic_poll(
    zctx: zmq.Context[Any], applier: EventApplier, make_transport: Any
) -> None:
    squatter = zctx.socket(zmq.PULL)
    port = squatter.bind_to_random_port("tcp://127.0.0.1")
    transport = make_transport(central=f"tcp://127.0.0.1:{port}", tuning=TIMERS_ONLY)
    transport.add_endpoint(Endpoint("10.2.1.1", 8000)).result(5)
    wait_until(lambda: _count(applier, "unknown", "socket_errors") >= 3, timeout=10, what="bind retried")
    squatter.close(0)
    wait_until(lambda: transport.diagnostics()["sockets"] >= 2, timeout=10, what="central SUB bound")


def test_an_idle_thread_sleeps_in_the_selector(
    zctx: zmq.Context[Any], applier: EventApplier, make_transport: Any
) -> None:
    pub = Publisher(zctx, "127.0.6.2")
    transport = make_transport(socket_port=pub.port, tuning=TIMERS_ONLY)
    transport.add_endpoint(pub.endpoint)
    pub.wait_subscribed()
    assert transport.wait_idle(5)
    rounds = transport.diagnostics()["rounds"]
    started = time.monotonic()
    time.sleep(1.0)  # a window to count wake-ups in, not a wait for a condition
    woke = transport.diagnostics()["rounds"] - rounds
    # Nothing arrives and no timer is due: the old fixed 50 ms poll woke 20 times in this window.
    assert woke <= 2, (woke, time.monotonic() - started)
    pub.close()


def _applied(applier: EventApplier, pubs: list[Publisher]) -> Callable[[], int]:
    """Messages applied so far from ``pubs``."""
    return lambda: sum(_count(applier, pub.endpoint_id, "batches") for pub in pubs)


def _four_publishers(
    zctx: zmq.Context[Any], make_transport: Any, first: int, *, batch_window: float
) -> tuple[list[Publisher], Any]:
    """Publishers on 127.0.6.<first>… sharing one port, subscribed to by an idle transport."""
    port = free_port(f"127.0.6.{first}")
    pubs = [Publisher(zctx, f"127.0.6.{first + i}", port) for i in range(4)]
    transport = make_transport(socket_port=port, tuning=TIMERS_ONLY, batch_window=batch_window)
    for pub in pubs:
        transport.add_endpoint(pub.endpoint)
    for pub in pubs:
        pub.wait_subscribed()
    assert transport.wait_idle(5)
    return pubs, transport


def test_sparse_messages_of_many_engines_share_wake_ups_within_the_batch_window(
    zctx: zmq.Context[Any], applier: EventApplier, make_transport: Any
) -> None:
    """Decode steps of many streams arrive one block each, tens of ms apart: once a window has
    measured the trickle, the thread serves it in a few rounds per window instead of one per
    message, and still applies every one."""
    pubs, transport = _four_publishers(zctx, make_transport, 10, batch_window=0.25)
    rounds = transport.diagnostics()["rounds"]
    for n in range(60):  # 60 messages over ~1.2 s: traffic pacing, not a wait
        payload, _ = chain(1000 + n, 1, 16 * n + 1)
        pubs[n % 4].send(payload)
        time.sleep(0.02)

    applied = _applied(applier, pubs)
    wait_until(lambda: applied() == 60, timeout=10, what="every message applied", context=applied)
    diagnostics = transport.diagnostics()
    woke = diagnostics["rounds"] - rounds
    # One round per message without the window (60). With it: one per message over the first
    # window (≈ 13, the trickle is not measured yet), then ≈ 2 per window of sending (the pause
    # and the round after it) and the one that waits for more. A busy machine stretches the
    # sleeps: more windows, each with fewer messages.
    assert diagnostics["pauses"] >= 2, diagnostics
    assert woke <= 40, woke
    for pub in pubs:
        pub.close()


def test_a_dense_stream_is_read_as_it_comes_through_many_windows(
    zctx: zmq.Context[Any], applier: EventApplier, make_transport: Any
) -> None:
    """A busy pool's messages (here ≈ 1,000 a second for ≥ 2 s, far above 128 per window) are
    never held for a window: a pause would only queue them toward the sockets' high-water mark
    and age the index. Without the density rule every window after the first pauses."""
    pubs, transport = _four_publishers(zctx, make_transport, 20, batch_window=0.25)
    for n in range(4000):
        payload, _ = chain(50_000 + n, 1, 16 * n + 1)
        pubs[n % 4].send(payload)
        if n % 20 == 19:  # traffic pacing, not a wait: ≥ 20 messages per 10–20 ms
            time.sleep(0.01)

    applied = _applied(applier, pubs)
    wait_until(lambda: applied() == 4000, timeout=30, what="every message applied", context=applied)
    assert transport.diagnostics()["pauses"] == 0
    for pub in pubs:
        pub.close()


def test_an_arriving_request_ends_the_batch_window_pause_and_the_thread_reads_what_gathered(
    zctx: zmq.Context[Any], applier: EventApplier, make_transport: Any
) -> None:
    """A request's decision must not wait out the window: ``flush`` (called as its headers
    arrive) ends a pause that has run long enough, and ``wait_flushed`` (called before the index is
    read) returns once the message that was waiting in it is applied."""
    pubs, transport = _four_publishers(zctx, make_transport, 30, batch_window=1.0)
    sent = 0

    def send() -> None:
        nonlocal sent
        payload, _ = chain(3000 + sent, 1, 16 * sent + 1)
        pubs[sent % 4].send(payload)
        sent += 1

    applied = _applied(applier, pubs)
    while transport.diagnostics()["pauses"] < 2:  # a trickle, until the thread gathers it
        assert sent < 500, transport.diagnostics()
        send()
        time.sleep(0.02)  # traffic pacing, not a wait
    flushes = transport.diagnostics()["flushes"]
    # Mid-pause, with most of the window still to run: the next message waits in it. The pause
    # runs 0.1 s more before the flush, so the message has reached the subscriber's socket.
    cut = transport.diagnostics()["pauses_cut"]
    pause_in_flight(transport)
    send()
    pause_in_flight(transport, after=transport.diagnostics()["paused_for"] + 0.1)
    assert applied() < sent  # held by the pause
    assert transport.flush()
    assert transport.wait_flushed(timeout=10)  # what a decision waits for (at most 1 ms by default)
    assert applied() == sent
    assert transport.wait_flushed(timeout=0)  # nothing outstanding: no wait
    diagnostics = transport.diagnostics()
    assert diagnostics["pauses_cut"] == cut + 1, diagnostics  # ended by the flush, not the window
    assert diagnostics["flushes"] == flushes + 1
    for pub in pubs:
        pub.close()


def test_a_flush_without_a_pause_does_nothing(
    zctx: zmq.Context[Any], applier: EventApplier, make_transport: Any
) -> None:
    pub = Publisher(zctx, "127.0.6.40")
    transport = make_transport(socket_port=pub.port, tuning=TIMERS_ONLY, batch_window=1.0)
    transport.add_endpoint(pub.endpoint)
    pub.wait_subscribed()
    assert transport.wait_idle(5)
    rounds = transport.diagnostics()["rounds"]
    assert transport.flush() is False  # idle in the selector: input would wake it anyway
    assert transport.diagnostics()["flushes"] == 0
    assert transport.wait_idle(5)
    assert transport.diagnostics()["rounds"] - rounds <= 2  # the barrier's own round(s) only
    pub.close()


def test_a_trickle_of_prefill_sized_messages_is_read_as_it_comes(
    zctx: zmq.Context[Any], applier: EventApplier, make_transport: Any
) -> None:
    """Few messages, but each a prompt's worth of blocks: never gathered. A pause would only make
    the next request's flush wait for their apply."""
    pubs, transport = _four_publishers(zctx, make_transport, 44, batch_window=0.25)
    for n in range(40):
        payload, _ = chain(200_000 + 1000 * n, 600, 1 + 16 * 600 * n)
        assert len(payload) > 16384
        pubs[n % 4].send(payload)
        time.sleep(0.02)  # traffic pacing, not a wait: a trickle by count (50 a second)

    applied = _applied(applier, pubs)
    wait_until(lambda: applied() == 40, timeout=30, what="every message applied", context=applied)
    assert transport.diagnostics()["pauses"] == 0
    for pub in pubs:
        pub.close()
