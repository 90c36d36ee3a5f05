"""A live message that carries nothing applicable decides nothing (issue #11 F4): wherever its
seq falls, it neither clears the endpoint nor starts a replay nor moves the stream position, so
it cannot make the engine's own next message look like a restart either. No sockets; the
generated version is ``tests/reliability/test_kv_frame_fuzz.py``."""

from __future__ import annotations

import msgpack
import pytest
from test_kv_transport_ingest import Harness, stored

from ppc_extproc.events.transport.replay import Action

GARBAGE = {
    "msgpack": (b"\xc1", "bad_payload"),
    "unknown-tag": (bytes(msgpack.packb([1.0, [["BlockExploded", [1]]], 0])), "no_usable_events"),
    "inconsistent": (
        bytes(msgpack.packb([1.0, [["BlockStored", [1, 2, 3], None, list(range(32)), 16, None, "GPU"]], 0])),
        "no_usable_events",
    ),
}


@pytest.mark.parametrize("kind", GARBAGE)
@pytest.mark.parametrize("replay", [False, True])
@pytest.mark.parametrize("seq", [0, 1, 2, 7, 2**64 - 1], ids=["regressed", "last", "next", "gap", "max"])
def test_garbage_at_any_seq_changes_nothing(kind: str, replay: bool, seq: int) -> None:
    payload, counter = GARBAGE[kind]
    h = Harness(replay=replay)
    h.live(0, stored(1, 100))
    h.live(1, stored(2, 200))
    h.replays.sessions.clear()
    h.live(seq, payload)
    assert h.holds(100) and h.holds(200) and h.src.last_seq == 1
    assert h.count("restarts_detected") == 0 and h.count("gaps") == 0 and not h.replays.sessions
    assert h.count(counter) == 1
    h.live(2, stored(3, 300))  # the engine's own next message is in line
    assert h.holds(100) and h.holds(300) and h.count("gaps") == 0 and h.count("restarts_detected") == 0


def test_garbage_on_first_contact_sets_no_position() -> None:
    h = Harness(replay=False)
    h.live(2**63, b"\xc1")
    assert h.src.last_seq is None
    h.live(0, stored(1, 100))
    h.live(1, stored(2, 200))
    assert h.holds(200) and h.count("restarts_detected") == 0


def test_a_real_restart_with_an_empty_batch_is_still_a_restart() -> None:
    """An empty batch is valid: it advances the stream (vLLM never sends one, tests do)."""
    h = Harness(replay=False)
    h.live(0, stored(1, 100))
    h.live(1, stored(2, 200))
    h.live(0, bytes(msgpack.packb([1.0, [], 0])))
    assert not h.holds(100) and h.count("restarts_detected") == 1


def test_garbage_from_the_engines_replay_consumes_its_seq() -> None:
    """The replay ROUTER is the engine's own: replaying an unusable batch again would not help."""
    h = Harness(replay=True)
    h.live(0, stored(1, 100))
    h.live(3, stored(4, 400))  # gap: replay from 1
    assert h.reply(1, b"\xc1") is Action.CONTINUE
    assert h.reply(2, stored(3, 300)) is Action.CONTINUE
    assert h.end() is Action.FINISH
    assert h.src.last_seq == 3 and h.holds(300) and h.holds(400)
    assert len(h.replays.sessions) == 1
