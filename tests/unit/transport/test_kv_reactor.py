"""The ingestion loop's reactor on real ZMQ sockets, and when the loop pauses to gather messages."""

from __future__ import annotations

import select
import threading
import time
from collections.abc import Callable, Iterator

import pytest
import zmq

from ppc_extproc.events.transport.policy import StreamDensity, TransportTuning
from ppc_extproc.events.transport.reactor import Reactor


@pytest.fixture
def pair() -> Iterator[tuple[zmq.Socket[bytes], zmq.Socket[bytes]]]:
    ctx = zmq.Context()
    push, pull = ctx.socket(zmq.PUSH), ctx.socket(zmq.PULL)
    try:
        port = pull.bind_to_random_port("tcp://127.0.0.1")
        push.connect(f"tcp://127.0.0.1:{port}")
        yield push, pull
    finally:
        push.close(0)
        pull.close(0)
        ctx.term()


def _reactor_after_one_message(push: zmq.Socket[bytes], pull: zmq.Socket[bytes], received: list[bytes]) -> Reactor:
    """A reactor on ``pull`` whose handler appends to ``received``, having served one message."""
    reactor = _reactor(pull, received)
    push.send(b"first")
    _run_until(reactor, received, 1)
    return reactor


def _drain_into(sock: zmq.Socket[bytes], received: list[bytes]) -> Callable[[], bool]:
    """A handler reading everything ``sock`` has into ``received``."""

    def drain() -> bool:
        while True:
            try:
                received.append(sock.recv(zmq.NOBLOCK))
            except zmq.Again:
                return False

    return drain


def _reactor(pull: zmq.Socket[bytes], received: list[bytes]) -> Reactor:
    reactor = Reactor()
    reactor.add(pull, _drain_into(pull, received))
    return reactor


def _run_until(reactor: Reactor, received: list[bytes], count: int, timeout: float = 10.0) -> int:
    deadline = time.monotonic() + timeout
    active = 0
    while len(received) < count:
        assert time.monotonic() < deadline, f"only {len(received)} of {count} messages arrived"
        active = reactor.run_once(0.5)
    return active


def test_a_round_that_found_input_waiting_records_no_wait(pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes]]) -> None:
    push, pull = pair
    received: list[bytes] = []
    reactor = _reactor_after_one_message(push, pull, received)
    push.send(b"b")
    # Wait until the socket's notification descriptor is signalled (select on it, which does not
    # consume the signal as reading ZMQ_EVENTS would), so the round finds the input waiting.
    readable, _, _ = select.select([pull.getsockopt(zmq.FD)], [], [], 10)
    assert readable
    reactor.run_once(0.5)
    assert received == [b"first", b"b"]
    assert reactor.waited < 0.05


def test_a_message_after_a_quiet_spell_records_the_wait(pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes]]) -> None:
    push, pull = pair
    received: list[bytes] = []
    reactor = _reactor_after_one_message(push, pull, received)
    sent = threading.Event()
    sender = threading.Thread(target=lambda: (time.sleep(0.05), push.send(b"late"), sent.set()))
    sender.start()
    try:
        _run_until(reactor, received, 2)
    finally:
        sender.join(10)
    assert sent.is_set()
    assert reactor.waited >= 0.02  # the select slept until the message came (50 ms after the first)


def test_the_loop_pauses_only_inside_a_steady_stream() -> None:
    tuning = TransportTuning(coalesce_seconds=0.0005, coalesce_below=4)
    assert tuning.pause_after(1, 0.0) == 0.0005  # input was already waiting: gather more
    assert tuning.pause_after(3, 0.0001) == 0.0005
    assert tuning.pause_after(1, 0.3) == 0.0  # a decode step's block after a quiet spell
    assert tuning.pause_after(4, 0.0) == 0.0  # enough sockets had input: no need to gather
    assert tuning.pause_after(0, 0.0) == 0.0  # nothing came (a timer round)
    assert TransportTuning(coalesce_seconds=0.0).pause_after(1, 0.0) == 0.0  # coalescing off


def test_a_batch_window_pauses_while_messages_come_closer_than_the_window() -> None:
    tuning = TransportTuning(coalesce_seconds=0.0005, coalesce_below=4)
    assert tuning.pause_after(1, 0.03, window=0.05) == 0.05  # a block 30 ms after the last
    assert tuning.pause_after(16, 0.0, window=0.05) == 0.05  # input that came during the pause
    assert tuning.pause_after(1, 0.3, window=0.05) == 0.0  # after a quiet spell: served alone
    assert tuning.pause_after(0, 0.0, window=0.05) == 0.0  # a timer round: nothing to gather for
    # A socket left undrained, a replay or a wait_idle caller: read on at once, window or not.
    assert tuning.pause_after(1, 0.0, window=0.05, backlog=True) == 0.0
    assert tuning.pause_after(1, 0.0, backlog=True) == 0.0
    assert tuning.pause_after(1, 0.0, window=0.0) == 0.0005  # no window: the steady-stream rule


#: A decode step's message: one block and its hashes.
STEP_BYTES = 200


def decode_steps(density: StreamDensity, now: float, read: int) -> bool:
    """``density.update`` for a stream of decode steps only."""
    return density.update(now, read, read * STEP_BYTES)


def test_a_trickle_measured_over_a_window_is_sparse_and_a_dense_stream_is_not() -> None:
    density = StreamDensity(window=0.25, dense_per_second=512, small_bytes=16384)
    assert not decode_steps(density, 100.0, 0)  # the first round: nothing measured yet
    assert not decode_steps(density, 100.1, 2)  # within the window: the decision stands
    assert decode_steps(density, 100.26, 4)  # 4 messages in a window: a trickle
    assert decode_steps(density, 100.52, 10)
    assert not decode_steps(density, 100.78, 10 + 140)  # 140 in a window: dense, read as it comes
    assert not decode_steps(density, 100.9, 10 + 140 + 1)  # a gap inside the window does not flip it
    assert decode_steps(density, 101.04, 10 + 140 + 2)  # the stream thinned out again


def test_a_trickle_of_large_messages_is_read_as_it_comes() -> None:
    """Prompts' prefill blocks (hundreds per message) are not gathered: a request's flush would
    make its decision wait for their apply, and a wake-up costs little next to it."""
    density = StreamDensity(window=0.25, dense_per_second=512, small_bytes=16384)
    assert not density.update(100.0, 0, 0)
    assert density.update(100.26, 4, 4 * STEP_BYTES)  # four decode steps of ~200 bytes: a trickle
    assert not density.update(100.52, 6, 4 * STEP_BYTES + 2 * 400_000)  # two prompts' prefill blocks
    assert density.update(100.78, 10, 4 * STEP_BYTES + 2 * 400_000 + 4 * STEP_BYTES)  # decode steps again


def test_the_window_that_ends_a_quiet_spell_does_not_make_the_stream_sparse() -> None:
    """A burst after silence is read as it comes until a window has measured it: a pause at its
    start would queue the whole burst."""
    density = StreamDensity(window=0.25, dense_per_second=512, small_bytes=16384)
    assert not decode_steps(density, 100.0, 0)
    assert decode_steps(density, 100.3, 3)
    assert not decode_steps(density, 110.0, 4)  # the first message after 10 s of silence
    assert not decode_steps(density, 110.1, 500)  # the burst that follows
    assert not decode_steps(density, 110.25, 2000)  # measured dense
    # A window stretched by a long round still compares per window (30 in 0.45 s is sparse):
    assert decode_steps(density, 110.7, 2030)


def test_a_pause_ends_when_a_priority_socket_signals_and_leaves_other_input_for_the_next_round(
    pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes]],
) -> None:
    push, pull = pair
    received: list[bytes] = []
    reactor = _reactor_after_one_message(push, pull, received)
    ctx = zmq.Context.instance()
    wake_rx, wake_tx = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    try:
        wake_rx.bind("inproc://reactor-pause-test")
        wake_tx.connect("inproc://reactor-pause-test")
        commands: list[bytes] = []
        reactor.add(wake_rx, _drain_into(wake_rx, commands), priority=True)
        reactor.run_once(0.0)  # the registration round: nothing there yet
        # Data alone does not end a pause (it would wait its 0.2 s out) and is not lost.
        push.send(b"second")
        assert reactor.pause(0.2) is False
        # A command does: a pause of 30 s returns at once with it.
        wake_tx.send(b"add")
        assert reactor.pause(30.0) is True
        reactor.run_once(0.0)
        assert commands == [b"add"]
        _run_until(reactor, received, 2)
        assert received == [b"first", b"second"]
    finally:
        reactor.close()
        wake_rx.close(0)
        wake_tx.close(0)
