"""The ingestion thread's timers wake it when they are due, not a fixed-rate poll: with the poll
interval (the longest wait) set far beyond the test's timeouts, replay timeouts and socket
retries still fire, and an idle thread does not spin."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import zmq
from kv_transport_helpers import FAST, Publisher, ReplayRouter, free_port, wait_until
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


def test_sparse_messages_of_many_engines_share_wake_ups_within_the_batch_window(
    zctx: zmq.Context[Any], applier: EventApplier, make_transport: Any
) -> None:
    """Decode steps of many streams arrive one block each, a few ms apart: with a batch window the
    thread serves them in a few rounds instead of one each, and still applies every one."""
    port = free_port("127.0.6.10")
    pubs = [Publisher(zctx, f"127.0.6.{10 + i}", port) for i in range(4)]
    transport = make_transport(socket_port=port, tuning=TIMERS_ONLY, batch_window=0.25)
    for pub in pubs:
        transport.add_endpoint(pub.endpoint)
    for pub in pubs:
        pub.wait_subscribed()
    assert transport.wait_idle(5)
    rounds = transport.diagnostics()["rounds"]
    for n in range(40):  # 40 messages over ~0.2 s: traffic pacing, not a wait
        payload, _ = chain(1000 + n, 1, 16 * n + 1)
        pubs[n % 4].send(payload)
        time.sleep(0.005)

    def applied() -> int:
        return sum(_count(applier, pub.endpoint_id, "batches") for pub in pubs)

    wait_until(lambda: applied() == 40, timeout=10, what="every message applied", context=applied)
    woke = transport.diagnostics()["rounds"] - rounds
    # One round per message without the window (40); with it, two for the first messages, then a
    # round per 0.25 s of sending (≈ 0.2 s idle, longer when a busy machine stretches the sleeps)
    # and the one that waits for more.
    assert woke <= 12, woke
    for pub in pubs:
        pub.close()
