"""A request inside the mock engine: state, deterministic outputs and token timing."""

from __future__ import annotations

import asyncio
import enum
import hashlib
import random
from array import array
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ppc_extproc_lab.mock_vllm.cache import Allocation
    from ppc_extproc_lab.mock_vllm.kv_transfer import KvTransfer

__all__ = [
    "MAX_TOKEN_ID",
    "EngineAborted",
    "EngineRequest",
    "RequestRejected",
    "RequestState",
    "output_tokens",
]

#: Largest accepted token id + 1 (the router hashes tokens as uint32).
MAX_TOKEN_ID = 1 << 32
#: Output tokens are printable ASCII so that ``text`` is readable and round-trips as UTF-8.
_OUT_LO, _OUT_HI = 32, 127


class RequestRejected(ValueError):
    """The request is invalid or can never run (HTTP 400)."""


class EngineAborted(RuntimeError):
    """The request was aborted: engine restart, shutdown or client disconnect."""


class RequestState(enum.Enum):
    WAITING = "waiting"
    QUEUED_FOR_PREFILL = "queued_for_prefill"
    PREFILLING = "prefilling"
    #: A decode leg receiving its prompt's KV from a remote prefill (off the prefill lane).
    TRANSFERRING = "transferring"
    DECODING = "decoding"
    FINISHED = "finished"
    ABORTED = "aborted"


def output_tokens(prompt: Sequence[int], n: int, seed: int = 0) -> list[int]:
    """Deterministic output ids for ``prompt``: a PRNG seeded by a hash of (seed, prompt),
    so every engine with the same seed answers a prompt identically."""
    h = hashlib.blake2b(array("q", prompt).tobytes(), digest_size=16, key=str(seed).encode()[:64])
    rng = random.Random(int.from_bytes(h.digest(), "big"))
    return [rng.randrange(_OUT_LO, _OUT_HI) for _ in range(n)]


def _silence(fut: asyncio.Future[None]) -> None:
    if not fut.cancelled():
        fut.exception()  # mark retrieved: nobody may be waiting (client gone)


class EngineRequest:
    """One sequence in the engine. HTTP handlers await :attr:`first_token` and :attr:`done`
    and read token times from :meth:`token_time`."""

    __slots__ = (
        "_decode_s",
        "admitted_at",
        "alloc",
        "arrival",
        "block_ids",
        "cache_salt",
        "cached_tokens",
        "decode_base",
        "done",
        "finished_at",
        "first_token",
        "first_token_at",
        "kv",
        "max_tokens",
        "output",
        "prefill_start",
        "prompt",
        "prompt_digests",
        "request_id",
        "state",
        "steps_done",
        "tokens",
        "transferred_tokens",
    )

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        request_id: str,
        prompt: list[int],
        max_tokens: int,
        cache_salt: str | None,
        output: list[int],
        prompt_digests: list[bytes],
        decode_s: float,
        kv: KvTransfer | None = None,
    ) -> None:
        self.request_id = request_id
        self.prompt = prompt
        self.max_tokens = max_tokens
        self.cache_salt = cache_salt
        self.output = output
        self.tokens = prompt + output
        self.prompt_digests = prompt_digests
        self.arrival = loop.time()
        self.admitted_at = self.arrival
        self.state = RequestState.WAITING
        self.alloc: Allocation | None = None
        self.cached_tokens = 0
        self.prefill_start: float | None = None
        self.first_token_at: float | None = None
        self.decode_base = 0.0
        self.finished_at: float | None = None
        self.steps_done = 0
        self.first_token: asyncio.Future[None] = loop.create_future()
        self.done: asyncio.Future[None] = loop.create_future()
        self.first_token.add_done_callback(_silence)
        self.done.add_done_callback(_silence)
        self._decode_s = decode_s
        #: The request's P/D role (``kv_transfer_params``), None for a plain request.
        self.kv = kv
        #: A prefill leg's block ids at finish (its ``remote_block_ids``).
        self.block_ids: list[int] = []
        #: Prompt tokens a decode leg received from the remote prefill.
        self.transferred_tokens = 0

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt)

    def token_time(self, i: int) -> float:
        """Loop time at which output token ``i`` (1-based) is produced; valid once started."""
        if self.first_token_at is None:
            raise RuntimeError("request has not produced its first token yet")
        if i <= 1:
            return self.first_token_at
        return self.decode_base + (i - 2) * self._decode_s

    @property
    def ttft(self) -> float | None:
        """Seconds from arrival to the first token."""
        return None if self.first_token_at is None else self.first_token_at - self.arrival
