"""Invalid KV-event messages for the fault suite, as raw ZMQ frames.

Every message generated here is invalid by construction — wrong frame count, a sequence frame
that is not 8 bytes, or a payload with nothing applicable (not msgpack, not a batch, wrong
types, claimed huge arrays, unknown tags, inconsistent BlockStored) — and may carry any seq.
A valid message would be allowed to change the index (even an empty batch at a lower seq is a
restart), so no generator here can produce one: random msgpack values cannot spell an event tag,
and every event template breaks a rule the decoder enforces.
"""

from __future__ import annotations

from typing import Any

import msgpack
from hypothesis import strategies as st

MODEL = "m"

# --- payloads ------------------------------------------------------------------------------------

msgpack_value = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=8)
    | st.binary(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=16,
)
token_list = st.lists(st.integers(0, 2**32 - 1), min_size=2, max_size=64)

#: Events the decoder must skip: each breaks exactly one rule.
bad_event = st.one_of(
    # tokens that do not split evenly over the hashes
    st.builds(lambda t, n: ["BlockStored", list(range(1, n + 1)), None, t, 16, None, "GPU"], token_list,
              st.integers(2, 64)).filter(lambda e: len(e[3]) % len(e[1]) != 0),
    st.builds(lambda t: ["BlockStored", [], None, t, 16, None, "GPU"], token_list),
    st.builds(lambda t, b: ["BlockStored", [7], None, t, b, None, "GPU"], token_list, st.integers(-(2**31), 0)),
    st.builds(lambda t, b: {"type": "BlockStored", "block_hashes": [7], "parent_block_hash": None, "token_ids": t,
                            "block_size": b, "lora_id": None, "medium": "GPU", "lora_name": None},
              token_list, st.integers(-(2**31), 0)),
    # wrong types
    st.builds(lambda h: ["BlockStored", h, None, [1] * 16, 16], st.sampled_from(["nope", None, 5, {"a": 1}])),
    st.builds(lambda h: ["BlockStored", [h], None, [1] * 16, 16], st.sampled_from([b"", "h", 1.5, None, True, [1]])),
    st.builds(lambda t: ["BlockStored", [1], None, [*([1] * 15), t], 16],
              st.sampled_from([1.5, "7", None, True, [1], {"t": 1}])),
    st.builds(lambda m: ["BlockStored", [1], None, [1] * 16, 16, None, m], st.sampled_from([7, [], b"GPU", True])),
    st.builds(lambda g: ["BlockStored", [1], None, [1] * 16, 16, None, "GPU", None, None, g],
              st.sampled_from([-1, "0", 1.5])),
    st.builds(lambda h: ["BlockRemoved", h], st.sampled_from(["nope", None, 5, [b""], [1.5], [None]])),
    st.builds(lambda k: ["BlockStored", [1], None, [1] * 16, 16, None, "GPU", None, k],
              st.sampled_from([[5], "x", [1, 2]])),
    # unknown tags and shapes
    st.builds(lambda tag, rest: [tag, *rest], st.text(max_size=12).filter(
        lambda t: t not in ("BlockStored", "BlockRemoved", "AllBlocksCleared")), st.lists(msgpack_value, max_size=3)),
    st.builds(lambda tag: {"type": tag}, st.one_of(st.integers(-(2**63), 2**64 - 1), st.none(), st.text(max_size=5))),
    st.sampled_from([[], 42, None, "AllBlocksCleared", b"\xc1", msgpack.packb(["Nope"])]),
)
ts = st.floats(allow_nan=False, allow_infinity=False) | st.integers(0, 2**40)
#: Batches whose every event is skipped.
skipped_batch = st.builds(lambda t, events, rank: msgpack.packb([t, events, *rank]), ts,
                          st.lists(bad_event, min_size=1, max_size=4), st.sampled_from([[], [0], [1], [None]]))
#: Batches that are not batches.
bad_batch = st.one_of(
    st.builds(lambda v: msgpack.packb(v), msgpack_value).filter(lambda b: not _empty_batch(b)),
    st.builds(lambda t, e: msgpack.packb([t, e]), st.sampled_from(["ts", None, True, [1.0]]), st.just([])),
    st.builds(lambda e: msgpack.packb([1.0, e]), st.sampled_from([{}, "events", 3, None])),
    st.builds(lambda r: msgpack.packb([1.0, [], r]), st.sampled_from([-1, True, "0", 1.5, [0]])),
    st.builds(lambda v: msgpack.packb({"ts": 1.0, "events": v}), st.lists(bad_event, max_size=2)),
)
#: Fixed nasty payloads: claimed sizes beyond the data, deep nesting, the 4M-token bound.
_NASTY = [
    b"",
    b"\xc1",
    b"\xdd\xff\xff\xff\xff" + b"\x00" * 16,  # array32 of 4 billion elements, truncated
    b"\xdf\xff\xff\xff\xff" + b"\x00" * 16,  # map32 of 4 billion entries, truncated
    b"\xc6\xff\xff\xff\xff" + b"\x00" * 16,  # bin32 of 4 GB, truncated
    b"\x93\xcb\x00\x00\x00\xdd\xff\xff\xff\xff",  # a batch whose events claim 4 billion
    b"\x91" * 100_000 + b"\xc0",  # arrays nested 100,000 deep
    msgpack.packb([1.0, [["BlockStored", list(range(1, 2**16 + 1)), None, [1] * (2**22 + 2**16), 16, None, "GPU"]]]),
]


def nasty(i: int) -> bytes:
    """One of the fixed nasty payloads (by number, so that reprs stay short)."""
    return _NASTY[i]


payload = st.one_of(st.binary(max_size=96), skipped_batch, bad_batch, st.builds(nasty, st.integers(0, len(_NASTY) - 1)))


def _empty_batch(data: bytes) -> bool:
    """A random value that happens to be ``[number, []]`` (+ rank): a valid, empty batch."""
    value = msgpack.unpackb(data, strict_map_key=False)
    return (
        isinstance(value, list) and 2 <= len(value) <= 3 and isinstance(value[0], (int, float))
        and not isinstance(value[0], bool) and value[1] == []
    )


# --- frames --------------------------------------------------------------------------------------

seq_frame = st.integers(0, 2**64 - 1).map(lambda s: s.to_bytes(8, "big"))
bad_seq_frame = st.binary(max_size=16).filter(lambda b: len(b) != 8) | st.sampled_from([b"123456789", b"1" * 9])


def topics(pod: str) -> st.SearchStrategy[bytes]:
    return st.one_of(
        st.just(f"kv@{pod}@{MODEL}".encode()),
        st.just(f"kv@{pod}@other-model".encode()),
        st.binary(max_size=24),
        st.sampled_from([b"", b"kv@@m", b"kv@a@b@c", b"\xff@" + pod.encode() + b"@m", b"kv@10.0.0.9:8000@m"]),
    )


def invalid_messages(pod: str) -> st.SearchStrategy[list[bytes]]:
    """Frames of one invalid message about ``pod`` (or with a broken topic)."""
    return st.one_of(
        st.lists(st.binary(max_size=16), min_size=1, max_size=2),  # too few frames (ZMQ sends at least one)
        st.lists(st.binary(max_size=16), min_size=4, max_size=6),  # too many
        st.builds(lambda t, s, p: [t, s, p], topics(pod), bad_seq_frame, payload),
        st.builds(lambda t, s, p: [t, s, p], topics(pod), seq_frame, payload),
        st.builds(lambda t, s, p: [t, s, p], topics(pod), seq_frame, payload),  # weighted: payload faults
    )


def implausible_seq_messages(pod: str) -> st.SearchStrategy[list[bytes]]:
    """A real-looking batch (valid payload) under a sequence frame far beyond the engine's counter
    (a corrupt frame, or another publisher's counter): it must be kept aside, never applied."""
    far = st.integers(2**40, 2**64 - 1).map(lambda s: s.to_bytes(8, "big")) | st.sampled_from(
        [b"AAAAAAAA", b"12345678", b"\xff" * 8])
    chains = st.integers(0, 2**16).map(lambda i: valid_chain(0x4000_0000 + 4 * i, 400_000 + 32 * i)[0])
    return st.builds(lambda s, p: [f"kv@{pod}@{MODEL}".encode(), s, p], far, chains)


def valid_chain(first_hash: int, first_token: int, n_blocks: int = 2) -> tuple[bytes, list[int]]:
    tokens = list(range(first_token, first_token + 16 * n_blocks))
    event: list[Any] = ["BlockStored", list(range(first_hash, first_hash + n_blocks)), None, tokens, 16, None, "GPU"]
    return msgpack.packb([1700000000.0, [event], 0]), tokens


#: The counters that say why a message was dropped or kept aside (beyond ``dropped`` reasons).
WHY = ("bad_frames", "bad_seq", "bad_payload", "no_usable_events", "bad_topic", "topic_not_in_pool", "seq_suspects")


def why(stats: Any) -> int:
    """Drops explained so far: every drop reason plus the transport counters in ``WHY``."""
    return stats.dropped_total() + sum(n for (_, name), n in list(stats.transport.items()) if name in WHY)
