"""A message that carries nothing applicable decides nothing (issue #11 F4): out of line, it
neither clears the endpoint nor starts a replay nor moves the sequence. In line, it consumes its
seq, as before. No sockets; the generated version is ``tests/reliability/test_kv_frame_fuzz.py``."""

from __future__ import annotations

import msgpack
import pytest
from test_kv_transport_ingest import Harness, stored

GARBAGE = [
    b"\xc1",
    bytes(msgpack.packb([1.0, [["BlockExploded", [1]]], 0])),  # every event skipped: unknown tag
    bytes(msgpack.packb([1.0, [["BlockStored", [1, 2, 3], None, list(range(32)), 16, None, "GPU"]], 0])),  # 32/3
]


@pytest.mark.parametrize("payload", GARBAGE, ids=["msgpack", "unknown-tag", "inconsistent"])
@pytest.mark.parametrize("replay", [False, True])
def test_garbage_with_a_regressed_seq_does_not_clear_the_endpoint(payload: bytes, replay: bool) -> None:
    h = Harness(replay=replay)
    h.live(0, stored(1, 100))
    h.live(1, stored(2, 200))
    h.replays.sessions.clear()
    h.live(0, payload)
    h.live(7, payload)  # nor does a gap
    assert h.holds(100) and h.holds(200) and h.src.last_seq == 1
    assert h.count("restarts_detected") == 0 and h.count("gaps") == 0
    assert h.count("out_of_line_invalid") == 2 and not h.replays.sessions
    h.live(2, stored(3, 300))  # the engine's next message is in line
    assert h.holds(300) and h.count("gaps") == 0


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
