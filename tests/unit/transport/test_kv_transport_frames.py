"""Frame rules of the KV-event transport (no sockets)."""

from __future__ import annotations

import pytest

from ppc_extproc.events.transport.frames import (
    END_SEQ,
    decode_seq,
    encode_seq,
    is_ip_port,
    parse_replay_reply,
    parse_topic,
    split_message,
    tcp_address,
)
from ppc_extproc.events.transport.ratelimit import RateLimitedLog


def test_seq_frames_are_8_byte_big_endian() -> None:
    assert encode_seq(5) == bytes.fromhex("0000000000000005")
    assert decode_seq(bytes.fromhex("0000000000000005")) == 5
    assert decode_seq(b"\xff" * 8) == END_SEQ == (-1) & (2**64 - 1)
    assert decode_seq(bytes.fromhex("0000000000000102") + b"extra") is None  # llm-d would read 8
    assert decode_seq(b"123456789") is None
    assert decode_seq(b"\x00" * 7) is None
    assert decode_seq(b"") is None


def test_a_live_message_is_three_frames_with_an_8_byte_seq() -> None:
    assert split_message([b"kv@a:1@m", encode_seq(7), b"p"]) == (b"kv@a:1@m", 7, b"p")
    assert split_message([b"t", b"123456789", b"p"]) == "bad_seq"
    assert split_message([b"t", b"\x00" * 7, b"p"]) == "bad_seq"
    for frames in ([], [b"t"], [b"t", encode_seq(1)], [b"t", encode_seq(1), b"p", b""]):
        assert split_message(frames) == "bad_frames"


def test_topic_is_split_into_exactly_three_parts() -> None:
    topic = parse_topic(bytes.fromhex("6b764031302e302e302e353a38303030406d792d6d6f64656c"))  # §9.1
    assert topic is not None and (topic.pod_id, topic.model) == ("10.0.0.5:8000", "my-model")
    qwen = parse_topic(b"kv@10.0.0.5:8000@Qwen/Qwen2.5-1.5B-Instruct")
    assert qwen is not None and qwen.model == "Qwen/Qwen2.5-1.5B-Instruct"
    assert parse_topic(b"kv@10.0.0.5@m") is not None  # old form without port: parsed, warned later
    for bad in (b"", b"kv", b"kv@10.0.0.5:8000", b"kv@a@b@c", b"kv@@m", b"\xff@a@b"):
        assert parse_topic(bad) is None, bad


@pytest.mark.parametrize(
    ("pod_id", "ok"),
    [
        ("10.0.0.5:8000", True),
        ("[fd00::1]:8000", True),
        ("fd00::1:8000", True),
        ("10.0.0.5", False),
        ("pod-a:8000", False),
        ("10.0.0.5:0", False),
        ("10.0.0.5:99999", False),
        ("10.0.0.5:http", False),
    ],
)
def test_pod_id_must_be_ip_port(pod_id: str, ok: bool) -> None:
    assert is_ip_port(pod_id) is ok


def test_tcp_address_brackets_ipv6() -> None:
    assert tcp_address("10.0.0.5", 5557) == "tcp://10.0.0.5:5557"
    assert tcp_address("fd00::1", 5558) == "tcp://[fd00::1]:5558"
    assert tcp_address("[fd00::1]", 5558) == "tcp://[fd00::1]:5558"


def test_replay_replies_old_and_new_forms() -> None:
    """§9.9, captured from vLLM 0.33.0 (new form) and 0.11.0 (old form)."""
    topic = bytes.fromhex("6b764031302e302e302e353a38303030406d792d6d6f64656c")
    payload = bytes.fromhex("93cb41d954fc408000009181a474797065b0416c6c426c6f636b73436c656172656400")
    seq2 = bytes.fromhex("0000000000000002")
    new = parse_replay_reply([b"", topic, seq2, payload])
    assert new is not None and (new.topic, new.seq, new.payload, new.is_end) == (topic, 2, payload, False)
    old = parse_replay_reply([b"", seq2, payload])
    assert old is not None and (old.topic, old.seq, old.payload) == (None, 2, payload)
    for end in ([b"", b"", b"\xff" * 8, b""], [b"", b"\xff" * 8, b""]):
        reply = parse_replay_reply(end)
        assert reply is not None and reply.is_end
    for bad in ([], [b""], [b"", seq2], [b"", b"a", b"b", b"c", b"d"], [b"", b"\x00", payload]):
        assert parse_replay_reply(bad) is None


class _Recorder:
    def __init__(self) -> None:
        self.lines: list[tuple[str, str, dict[str, object]]] = []

    def warning(self, event: str, **data: object) -> None:
        self.lines.append(("warning", event, data))

    def info(self, event: str, **data: object) -> None:
        self.lines.append(("info", event, data))


def test_rate_limited_log_reports_what_it_suppressed() -> None:
    now = [0.0]
    rec = _Recorder()
    warn = RateLimitedLog(rec, 10.0, clock=lambda: now[0])
    for _ in range(5):
        warn.warning("kv_bad_topic", "a", topic="x")
    warn.warning("kv_bad_topic", "b")
    now[0] = 11.0
    warn.warning("kv_bad_topic", "a")
    assert [(e, d["endpoint"], d["suppressed"]) for _, e, d in rec.lines] == [
        ("kv_bad_topic", "a", 0),
        ("kv_bad_topic", "b", 0),
        ("kv_bad_topic", "a", 4),
    ]
