"""Frame-level rules of KV-event messages: topic, sequence number, replay replies, addresses.

Pure functions, no sockets. The frames are vLLM's (``vllm-project/vllm:
vllm/distributed/kv_events.py``, ``ZmqEventPublisher``): ``[topic, seq, payload]`` with ``seq`` an
8-byte big-endian counter; replay replies come from its ROUTER as ``[seq, payload]`` (vLLM ≤ 0.25)
or ``[topic, seq, payload]`` (≥ 0.26), ended by the seq ``-1``.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

__all__ = [
    "END_SEQ",
    "ReplayReply",
    "Topic",
    "decode_seq",
    "encode_seq",
    "is_ip_port",
    "parse_replay_reply",
    "parse_topic",
    "split_message",
    "tcp_address",
]

#: Sequence number of the replay end marker (``(-1).to_bytes(8, "big", signed=True)``).
END_SEQ = 0xFFFF_FFFF_FFFF_FFFF
_SEQ_BYTES = 8


def encode_seq(seq: int) -> bytes:
    """A sequence number as the 8-byte big-endian frame."""
    return seq.to_bytes(_SEQ_BYTES, "big")


def decode_seq(frame: bytes) -> int | None:
    """The sequence number in ``frame``; None unless it is exactly 8 bytes. (llm-d reads the first
    8 bytes of a longer frame: ``b"123456789"`` would be seq 3.5e18, a gap, and the engine's next
    real message would look like a restart. vLLM and SGLang always send 8.)"""
    if len(frame) == _SEQ_BYTES:
        return int.from_bytes(frame, "big")
    return None


def split_message(frames: list[bytes]) -> tuple[bytes, int, bytes] | str:
    """``(topic, seq, payload)`` of a live message, or why it is dropped: ``bad_frames`` (not
    exactly three frames) or ``bad_seq`` (a sequence frame that is not 8 bytes)."""
    if len(frames) != 3:
        return "bad_frames"
    topic, seq_frame, payload = frames
    seq = decode_seq(seq_frame)
    if seq is None:
        return "bad_seq"
    return topic, seq, payload


@dataclass(frozen=True, slots=True)
class Topic:
    """The parts of ``kv@<pod_id>@<model>``."""

    pod_id: str
    model: str


def parse_topic(topic: bytes) -> Topic | None:
    """``kv@<pod_id>@<model>`` split on ``@`` into exactly three parts; None otherwise
    (not UTF-8, wrong part count, empty pod id)."""
    try:
        text = topic.decode("utf-8")
    except UnicodeDecodeError:
        return None
    parts = text.split("@")
    if len(parts) != 3 or not parts[1]:
        return None
    return Topic(parts[1], parts[2])


def is_ip_port(pod_id: str) -> bool:
    """Whether ``pod_id`` is ``<ip>:<port>`` (IPv6 with or without brackets): a request-side id."""
    host, sep, port = pod_id.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        return False
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


def tcp_address(ip: str, port: int) -> str:
    """``tcp://ip:port``, with brackets around an IPv6 address."""
    ip = ip.strip("[]")
    return f"tcp://[{ip}]:{port}" if ":" in ip else f"tcp://{ip}:{port}"


@dataclass(frozen=True, slots=True)
class ReplayReply:
    """One message of a replay reply; ``topic`` is None in the old (vLLM ≤ 0.25) form."""

    topic: bytes | None
    seq: int
    payload: bytes

    @property
    def is_end(self) -> bool:
        return self.seq == END_SEQ and not self.payload


def parse_replay_reply(frames: list[bytes]) -> ReplayReply | None:
    """A DEALER-side replay message: drop one leading empty delimiter, then ``[seq, payload]`` (old
    form) or ``[topic, seq, payload]`` (vLLM ≥ 0.26, SGLang ≥ 0.5.22). None when malformed."""
    if frames and not frames[0]:
        frames = frames[1:]
    if len(frames) == 2:
        topic, (seq_frame, payload) = None, frames
    elif len(frames) == 3:
        topic, seq_frame, payload = frames
    else:
        return None
    seq = decode_seq(seq_frame)
    if seq is None:
        return None
    return ReplayReply(topic, seq, payload)
