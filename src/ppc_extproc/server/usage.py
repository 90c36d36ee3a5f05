"""Token usage from response bodies: OpenAI JSON, or the last ``usage`` of an SSE stream."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

__all__ = ["Usage", "UsageParser", "UsageSampler"]

#: Most response bytes kept for parsing; beyond it the body still flows, only usage is lost.
MAX_RESPONSE_BUFFER = 8 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    total_tokens: int | None = None
    #: ``usage.prompt_tokens_details.cached_tokens`` (vLLM with --enable-prompt-tokens-details).
    cached_tokens: int | None = None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _usage_of(obj: Any) -> Usage | None:
    if not isinstance(obj, dict):
        return None
    usage = obj.get("usage")
    if usage is None and isinstance(obj.get("response"), dict):  # Responses API: response.completed
        usage = obj["response"].get("usage")
    if not isinstance(usage, dict):
        return None
    details = usage.get("prompt_tokens_details")
    cached = _int(details.get("cached_tokens")) if isinstance(details, dict) else None
    return Usage(
        _int(usage.get("prompt_tokens", usage.get("input_tokens"))),
        _int(usage.get("completion_tokens", usage.get("output_tokens"))),
        _int(usage.get("total_tokens")),
        cached,
    )


class UsageParser:
    """Feed response body chunks; ``usage`` holds the latest usage seen."""

    def __init__(self, streaming: bool) -> None:
        self.streaming = streaming
        self.usage: Usage | None = None
        self._buffer = bytearray()
        self._overflow = False

    def feed(self, chunk: bytes) -> None:
        if self._overflow:
            return
        self._buffer += chunk
        if len(self._buffer) > MAX_RESPONSE_BUFFER:
            self._overflow = True
            self._buffer = bytearray()
            return
        if self.streaming:
            self._scan_lines()

    def finish(self) -> Usage | None:
        """End of body: parse what is left (the whole JSON body when not streaming)."""
        if self._overflow:
            return self.usage
        if self.streaming:
            self._buffer += b"\n"
            self._scan_lines()
        elif self._buffer:
            try:
                found = _usage_of(orjson.loads(bytes(self._buffer)))
            except orjson.JSONDecodeError:
                found = None  # not JSON: passed through unchanged, no usage
            self.usage = found or self.usage
        self._buffer = bytearray()
        return self.usage

    def _scan_lines(self) -> None:
        end = self._buffer.rfind(b"\n")
        if end < 0:
            return
        complete, self._buffer = bytes(self._buffer[: end + 1]), self._buffer[end + 1 :]
        if b'"usage"' not in complete:
            return
        for line in complete.split(b"\n"):
            line = line.strip()
            if not line.startswith(b"data:") or b'"usage"' not in line:
                continue
            try:
                found = _usage_of(orjson.loads(line[5:]))
            except orjson.JSONDecodeError:
                continue
            if found is not None:
                self.usage = found


class UsageSampler:
    """Which responses to read usage from, when Envoy does not send response bodies by default.

    Deterministic: with rate ``r`` every ``1/r``-th request is sampled (credit accumulates by ``r``
    per call), so rate 1 samples all, 0 none, 0.01 one in a hundred. One sampler per process; the
    event loop is single-threaded, so no lock.
    """

    __slots__ = ("_credit", "rate", "sampled", "seen")

    def __init__(self, rate: float) -> None:
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"usage sample rate must be within [0, 1], got {rate}")
        self.rate = rate
        self._credit = 1.0 - rate  # the first request is sampled when rate > 0
        self.seen = 0
        self.sampled = 0

    def sample(self) -> bool:
        self.seen += 1
        if self.rate <= 0.0:
            return False
        self._credit += self.rate
        if self._credit >= 1.0 - 1e-9:
            self._credit -= 1.0
            self.sampled += 1
            return True
        return False
