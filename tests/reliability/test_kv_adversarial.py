"""Adversarial KV-event traffic over real sockets: no message sequence switches prefix routing off
for an engine, one corrupt sequence frame clears nothing, and invalid neighbours never cost a valid
message — in both subscription modes where both apply."""

from __future__ import annotations

import random

import fault_tally as tally
import msgpack
import pytest
from kv_rig import MODES, POD, TOPIC, all_cleared, chain, open_rig

from ppc_extproc.events.apply import MAX_ENTRIES_PER_ENDPOINT

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("mode", MODES)
def test_a_flood_of_33_media_then_a_gpu_chain_is_indexed(mode: str) -> None:
    with open_rig(mode) as rig:
        for i in range(33):
            rig.send(chain(0x1000 + 4 * i, 10_000 + 64 * i, medium=f"variant-{i}")[0])
        payload, tokens = chain(0x9000, 90_000)
        rig.send(payload)
        rig.settle()
        assert rig.blocks(tokens) == 2
        stats = rig.applier.stats
        dropped = {reason: n for (_, reason), n in stats.dropped.items()}
        assert dropped == {"too_many_entries": 33 - MAX_ENTRIES_PER_ENDPOINT}, dropped
        assert rig.count("entries_evicted") == 1
        (table,) = rig.applier.entries.to_json().values()
        assert len(table) == MAX_ENTRIES_PER_ENDPOINT and {"tier": "gpu", "group": None} in [
            {k: v for k, v in row.items() if k != "uses"} for row in table
        ]
        # AllBlocksCleared resets the table: the refused medium is admitted again.
        rig.send(all_cleared())
        payload, tokens = chain(0xA000, 100_000, medium="variant-32")
        rig.send(payload)
        rig.settle()
        assert rig.blocks(tokens) == 2
        assert [row["tier"] for row in rig.applier.entries.to_json()[POD]] == ["variant-32"]


@pytest.mark.parametrize("seq_frame", [b"AAAAAAAA", b"\x00\x00\x00\x00\x00\x00\x00\x05", b"\xff" * 8],
                         ids=["ascii", "backwards", "all-ones"])
@pytest.mark.parametrize("mode", MODES)
def test_a_garbage_sequence_frame_leaves_the_index_unchanged(mode: str, seq_frame: bytes) -> None:
    with open_rig(mode) as rig:
        chains = []
        for i in range(20):
            payload, tokens = chain(0x100 + 4 * i, 1000 + 64 * i)
            rig.send(payload)
            chains.append(tokens)
        rig.settle()
        before = rig.applier.index.snapshot()
        assert all(rig.blocks(t) == 2 for t in chains)
        # A real batch whose sequence frame got corrupted.
        rig.send_raw([TOPIC, seq_frame, chain(0x7000, 70_000)[0]])
        rig.settle()
        assert rig.applier.index.snapshot() == before
        payload, tokens = chain(0x8000, 80_000)
        rig.send(payload)  # the engine goes on at seq 20
        rig.settle()
        assert rig.blocks(tokens) == 2 and all(rig.blocks(t) == 2 for t in chains)
        assert rig.count("restarts_detected") == 0 and rig.count("clears") == 0
        assert rig.applier.stats.dropped[(rig.engine.endpoint_id, "seq_implausible")] == 1
        assert [s.last_seq for s in rig.transport.sources()] == [20]
        tally.add(f"KV seq frames, ZMQ {mode}: garbage seq frames", 1)
        tally.add(f"KV seq frames, ZMQ {mode}: index changed by invalid input", 0)


def _malformed(rng: random.Random, i: int) -> list[bytes]:
    """One of the probe's invalid messages on the engine's topic; ``i`` makes chains distinct."""
    kind = rng.randrange(8)
    garbage_chain = chain(0x5_0000_0000 + 4 * i, 5_000_000 + 64 * i)[0]
    if kind == 0:  # a real-looking batch under a random sequence frame
        return [TOPIC, rng.randbytes(8), garbage_chain]
    if kind == 1:  # an empty batch under a random sequence frame
        return [TOPIC, rng.randbytes(8), bytes(msgpack.packb([1.0, []]))]
    if kind == 2:  # a real message of another engine (a foreign counter) under this topic
        return [TOPIC, rng.randrange(2**63, 2**64).to_bytes(8, "big"), garbage_chain]
    if kind == 3:  # an AllBlocksCleared under a random sequence frame
        return [TOPIC, rng.randbytes(8), all_cleared()]
    if kind == 4:
        return [TOPIC, rng.randbytes(8), rng.randbytes(rng.randrange(1, 64))]
    if kind == 5:
        return [TOPIC, rng.randbytes(rng.choice([0, 4, 7, 9, 16])), garbage_chain]
    if kind == 6:
        return [TOPIC] if rng.random() < 0.5 else [TOPIC, b"\x00" * 8, garbage_chain, b"extra"]
    return [TOPIC, rng.randbytes(8), bytes(msgpack.packb([1.0, [["Nope", 1]], 0]))]


def test_6000_malformed_messages_interleaved_with_valid_ones_lose_no_valid_chain() -> None:
    """The probe, reproduced: a second connection on the engine's topic interleaves 6,000 invalid
    messages with the engine's 1,700 batches. Every message arrives (no socket loss); what lost
    chains before was the sequence state: foreign seqs adopted as gaps, after which the engine's
    own next batch looked like a restart and cleared the endpoint. (A forger that follows the
    engine's counter closely, or replays its old batches, is what CURVE is for.)"""
    rng = random.Random(20)
    with open_rig("central") as rig:
        foreign = rig.foreign()
        chains = []
        malformed = 0
        for i in range(1_700):
            payload, tokens = chain(0x10_0000 + 4 * i, 100_000 + 64 * i)
            rig.send(payload)
            chains.append(tokens)
            for _ in range(4 if i % 2 else 3):
                if malformed < 6_000:
                    rig.send_raw(_malformed(rng, malformed), foreign)
                    malformed += 1
        assert malformed == 5_950
        for _ in range(50):
            rig.send_raw(_malformed(rng, malformed), foreign)
            malformed += 1
        rig.settle(timeout=120)
        assert rig.received() == rig.sent  # nothing was lost at the sockets
        lost = [i for i, tokens in enumerate(chains) if rig.blocks(tokens) != 2]
        assert lost == [], f"{len(lost)} of {len(chains)} valid chains lost"
        assert rig.count("restarts_detected") == 0 and rig.count("clears") == 0
        tally.add("KV central probe: valid chains", len(chains))
        tally.add("KV central probe: malformed messages", malformed)
        tally.add("KV central probe: valid chains lost", len(lost))
