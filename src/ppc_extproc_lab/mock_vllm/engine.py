"""A simulated vLLM engine core on asyncio: scheduling, a time model and KV events.

Time model (all times on the event loop's monotonic clock):

* at most ``max_num_seqs`` admitted requests; the rest wait in a FIFO queue (head-of-line:
  the head waits until its blocks can be reserved);
* one serial prefill lane: a request's prefill takes ``uncached_tokens / prefill_tokens_per_s``
  seconds and produces output token 1, so TTFT = queueing + lane wait + own prefill;
* decode runs in lockstep on a grid of ``decode_ms_per_token``: every running request
  produces one token per grid step, independently of the prefill lane;
* P/D (:mod:`~ppc_extproc_lab.mock_vllm.kv_transfer`): a decode leg (``do_remote_prefill``)
  skips the prefill lane; the prompt tokens it does not hold locally arrive after
  ``kv_transfer_ms_per_token`` each (llm-d-inference-sim's ``kv-cache-transfer-time-per-token``),
  are cached without BlockStored, and its first token follows. A prefill leg
  (``do_remote_decode``) runs as any request and keeps its block ids for the response.

KV events follow vLLM: when a prefill is scheduled (enters the lane) its hit is re-checked,
its blocks are allocated (evictions) and its full prompt blocks cached and stored, so later
requests can already hit them, as in vLLM where blocks are cached at scheduling time (and
events published right after ``schedule()``, the ≤0.11 timing); a decode step that starts a
block allocates it and one that fills a block stores it. What happens at one simulated
instant is published as one batch. The engine is callback-driven (one timer at the next instant that matters, no
per-token wake-ups) to stay cheap when many engines share a process.
"""

from __future__ import annotations

import asyncio
import dataclasses
import heapq
import itertools
import math
import uuid
from collections import deque
from collections.abc import Sequence
from typing import Any

import structlog

from ppc_extproc_lab.mock_vllm.cache import CapacityError, PrefixCache
from ppc_extproc_lab.mock_vllm.engine_config import EngineConfig, EngineCounters
from ppc_extproc_lab.mock_vllm.hashing import BlockHasher
from ppc_extproc_lab.mock_vllm.kv_transfer import KvTransfer
from ppc_extproc_lab.mock_vllm.publisher import EventPublisher, NullEventPublisher
from ppc_extproc_lab.mock_vllm.request import (
    MAX_TOKEN_ID,
    EngineAborted,
    EngineRequest,
    RequestRejected,
    RequestState,
    output_tokens,
)

__all__ = [
    "EngineAborted",
    "EngineConfig",
    "EngineCounters",
    "EngineRequest",
    "MockEngine",
    "RequestRejected",
    "RequestState",
    "output_tokens",
]

logger = structlog.get_logger()


_PREFILL_DONE, _DECODE, _TRANSFER_DONE = 0, 1, 2


class MockEngine:
    """One simulated engine core: scheduler, prefix cache and event publisher."""

    def __init__(self, config: EngineConfig, publisher: EventPublisher | None = None) -> None:
        self.config = config
        self.publisher: EventPublisher = publisher or NullEventPublisher()
        self.cache = PrefixCache(
            config.num_blocks, config.block_size, BlockHasher(config.block_size),
            hybrid=config.kv_groups == "hybrid",
        )
        self.counters = EngineCounters()
        self._decode_s = config.decode_ms_per_token / 1000.0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiting: deque[EngineRequest] = deque()
        self._running: dict[str, EngineRequest] = {}
        self._prefill_queue: deque[EngineRequest] = deque()
        self._prefilling: EngineRequest | None = None
        self._lane_free_at = 0.0
        self._heap: list[tuple[float, int, int, EngineRequest]] = []
        self._tie = itertools.count()
        self._timer: asyncio.TimerHandle | None = None
        self._kick_pending = False
        self._epoch = 0.0
        self._closed = False

    # ------------------------------------------------------------------ public API

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_running(self) -> int:
        return len(self._running)

    def submit(
        self,
        prompt: Sequence[int],
        max_tokens: int = 16,
        cache_salt: str | None = None,
        request_id: str | None = None,
        kv: KvTransfer | None = None,
    ) -> EngineRequest:
        """Queue a request (``kv``: its P/D role); raises :class:`RequestRejected` if it is invalid
        or can never fit."""
        if self._closed:
            raise EngineAborted("engine is shut down")
        loop = self._get_loop()
        tokens = self.validate(prompt, max_tokens)
        bs = self.config.block_size
        need = -(-(len(tokens) + max_tokens - 1) // bs)
        if need > self.config.num_blocks:
            self.counters.requests_rejected += 1
            raise RequestRejected(
                f"This request needs {need} KV-cache blocks of {bs} tokens "
                f"({len(tokens)} prompt + {max_tokens} output tokens) but the engine has only "
                f"{self.config.num_blocks}."
            )
        req = EngineRequest(
            loop,
            request_id or uuid.uuid4().hex,
            tokens,
            max_tokens,
            cache_salt,
            output_tokens(tokens, max_tokens, self.config.seed),
            self.cache.hasher.hash_blocks(tokens, cache_salt),
            self._decode_s,
            kv,
        )
        self.counters.requests_total += 1
        if kv is not None:
            self.counters.remote_decode_requests += kv.do_remote_decode
            self.counters.remote_prefill_requests += kv.do_remote_prefill
            self.counters.kv_transfer_invalid += kv.do_remote_prefill and not kv.pull_valid
        self._waiting.append(req)
        self._kick()
        return req

    @staticmethod
    def validate(prompt: Sequence[int], max_tokens: int) -> list[int]:
        """Check a token prompt and ``max_tokens``; returns the prompt as a list."""
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise RequestRejected(f"max_tokens must be at least 1, got {max_tokens!r}.")
        tokens = list(prompt)
        if not tokens:
            raise RequestRejected("The prompt cannot be empty.")
        for t in tokens:
            if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < MAX_TOKEN_ID:
                raise RequestRejected(f"Token id {t!r} is out of vocabulary.")
        return tokens

    def match(self, prompt: Sequence[int], cache_salt: str | None = None) -> tuple[int, int]:
        """``(cached_tokens, matched_tokens)`` a prompt would get now; no side effects."""
        return self.cache.match(list(prompt), cache_salt)

    def abort(self, req: EngineRequest, reason: str = "aborted") -> None:
        """Drop a request wherever it is and release its blocks."""
        if req.state in (RequestState.FINISHED, RequestState.ABORTED):
            return
        if req.state is RequestState.WAITING:
            self._waiting.remove(req)
        elif req.state is RequestState.QUEUED_FOR_PREFILL:
            self._prefill_queue.remove(req)
        if req.alloc is not None:
            self.cache.free(req.alloc)
            req.alloc = None
        self._running.pop(req.request_id, None)
        req.state = RequestState.ABORTED
        self.counters.requests_aborted += 1
        err = EngineAborted(reason)
        for fut in (req.first_token, req.done):
            if not fut.done():
                fut.set_exception(err)
        self._flush()
        self._kick()

    def reset_prefix_cache(self) -> bool:
        """vLLM's ``reset_prefix_cache``: succeeds only when no block is in use."""
        ok = self.cache.reset()
        self._flush()
        return ok

    def restart(self) -> None:
        """An engine restart as the router sees it: requests aborted, cache dropped, seq to 0,
        replay buffer emptied, no AllBlocksCleared."""
        self._abort_all("engine restarted")
        self.cache.drop()
        self.publisher.restart()
        self._reset_schedule()
        self.counters.restarts += 1
        logger.info("mock_vllm_restarted", model=self.config.model, topic=self.publisher.topic)

    def close(self) -> None:
        """Abort everything and stop the scheduler."""
        self._closed = True
        self._abort_all("engine shut down")
        self._reset_schedule()

    def state(self) -> dict[str, Any]:
        """Counters and block usage for ``GET /mock/state``."""
        st = self.cache.stats()
        counters = dataclasses.asdict(self.counters)
        for name in ("prefix_cache_queries", "prefix_cache_hits"):
            counters[f"{name}_tokens"] = counters.pop(name)
        return {
            "model": self.config.model,
            "block_size": self.config.block_size,
            "num_blocks": st.num_blocks,
            "blocks_used": st.used,
            "blocks_cached": st.cached,
            "blocks_free": st.free_cached + st.free_uncached,
            "blocks_free_cached": st.free_cached,
            "blocks_reserved": st.reserved,
            "kv_cache_usage": st.usage,
            "evictions": st.evictions,
            "seq": self.publisher.next_seq,
            "topic": self.publisher.topic,
            "requests_waiting": self.num_waiting,
            "requests_running": self.num_running,
            **counters,
        }

    # ------------------------------------------------------------------ scheduler

    def _get_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._epoch = self._loop.time()
        return self._loop

    def _kick(self) -> None:
        if self._loop is not None and not self._kick_pending and not self._closed:
            self._kick_pending = True
            self._loop.call_soon(self._tick)

    def _tick(self) -> None:
        self._kick_pending = False
        if self._closed or self._loop is None:
            return
        try:
            now = self._loop.time()
            while True:
                # Simulated time: the next due instant, so timer lateness does not shift the lane.
                sim = min(self._heap[0][0], now) if self._heap else now
                self._admit(sim)
                self._start_prefill()
                if not self._heap or self._heap[0][0] > now:
                    break
                t = self._heap[0][0]
                while self._heap and self._heap[0][0] == t:
                    _, _, kind, req = heapq.heappop(self._heap)
                    self._handle(kind, req, t)
                self._flush()
            self._flush()
        except Exception:  # a bug here must not stop the engine silently forever
            logger.exception("mock_vllm_scheduler_error", model=self.config.model)
        self._arm_timer()

    def _arm_timer(self) -> None:
        assert self._loop is not None
        if not self._heap:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            return
        when = self._heap[0][0]
        if self._timer is not None:
            if self._timer.when() == when:
                return
            self._timer.cancel()
        self._timer = self._loop.call_at(when, self._tick)

    def _push(self, t: float, kind: int, req: EngineRequest) -> None:
        heapq.heappush(self._heap, (t, next(self._tie), kind, req))

    def _admit(self, sim: float) -> None:
        while self._waiting and len(self._running) < self.config.max_num_seqs:
            req = self._waiting[0]
            if req.arrival > sim:
                return
            n_prompt = len(req.prompt)
            try:
                alloc = self.cache.try_admit(
                    req.prompt_digests, n_prompt, n_prompt + req.max_tokens - 1, req.cache_salt
                )
            except CapacityError as e:  # checked at submit; kept for safety
                self.abort(req, str(e))
                continue
            if alloc is None:
                return
            self._waiting.popleft()
            req.alloc = alloc
            req.admitted_at = sim
            self._running[req.request_id] = req
            kv = req.kv
            remote = len(req.prompt) - alloc.cached_tokens
            if kv is not None and kv.pull_valid and remote > 0:
                # vLLM's NixlConnector pulls what the local prefix cache lacks
                # (get_num_new_matched_tokens), asynchronously, off the prefill lane.
                req.state = RequestState.TRANSFERRING
                req.transferred_tokens = remote
                self._push(sim + remote * self.config.kv_transfer_ms_per_token / 1000.0, _TRANSFER_DONE, req)
                continue
            req.state = RequestState.QUEUED_FOR_PREFILL
            self._prefill_queue.append(req)

    def _start_prefill(self) -> None:
        if self._prefilling is not None or not self._prefill_queue:
            return
        req = self._prefill_queue.popleft()
        alloc = req.alloc
        assert alloc is not None
        n_prompt = len(req.prompt)
        # Scheduling the prefill: the hit may have grown since admission; the prompt's blocks
        # are allocated (evictions) and its full blocks cached now, so later requests can hit
        # them while this prefill runs (as in vLLM). Published as this instant's batch.
        self.cache.extend_hit(alloc, n_prompt)
        req.cached_tokens = alloc.cached_tokens
        self.counters.prefix_cache_queries += n_prompt
        self.counters.prefix_cache_hits += req.cached_tokens
        self.counters.prompt_tokens_total += n_prompt
        self.cache.advance(alloc, req.tokens, n_prompt)
        self._flush()
        start = max(self._lane_free_at, req.admitted_at)
        req.prefill_start = start
        req.state = RequestState.PREFILLING
        self._prefilling = req
        uncached = n_prompt - req.cached_tokens
        self._push(start + uncached / self.config.prefill_tokens_per_s, _PREFILL_DONE, req)

    def _handle(self, kind: int, req: EngineRequest, t: float) -> None:
        if kind == _PREFILL_DONE and self._prefilling is req:
            self._prefilling = None
            self._lane_free_at = t
        if req.state in (RequestState.ABORTED, RequestState.FINISHED) or req.alloc is None:
            return
        n_prompt = len(req.prompt)
        if kind == _TRANSFER_DONE:
            self._received(req, n_prompt)
        if kind in (_PREFILL_DONE, _TRANSFER_DONE):
            req.first_token_at = t
            req.state = RequestState.DECODING
            req.decode_base = self._grid_after(t)
            if not req.first_token.done():
                req.first_token.set_result(None)
            self._schedule_decode(req)
            return
        k = self._next_step(req)
        req.steps_done = k
        self.cache.advance(req.alloc, req.tokens, n_prompt + k)
        self._schedule_decode(req)

    def _received(self, req: EngineRequest, n_prompt: int) -> None:
        """A decode leg's KV arrived: its prompt blocks are cached, unpublished, and count as
        cached tokens (vLLM's ``num_cached_tokens`` includes external tokens)."""
        alloc = req.alloc
        assert alloc is not None
        self.counters.prefix_cache_queries += n_prompt
        self.counters.prefix_cache_hits += alloc.cached_tokens
        self.counters.prompt_tokens_total += n_prompt
        self.counters.kv_transfers += 1
        self.counters.kv_transfer_tokens += req.transferred_tokens
        req.cached_tokens = alloc.cached_tokens + req.transferred_tokens
        self.cache.advance(alloc, req.tokens, n_prompt, publish=False)
        self._flush()

    def _schedule_decode(self, req: EngineRequest) -> None:
        if req.steps_done >= req.max_tokens - 1:
            self._finish(req, req.token_time(req.max_tokens))
            return
        k = self._next_step(req)
        self._push(req.decode_base + (k - 1) * self._decode_s, _DECODE, req)

    def _next_step(self, req: EngineRequest) -> int:
        """The next decode step that allocates or fills a block, or the last step."""
        last = req.max_tokens - 1
        k = req.steps_done + 1
        bs = self.config.block_size
        m = (len(req.prompt) + k) % bs
        if bs == 1 or m in (0, 1):
            return min(k, last)
        return min(k + bs - m, last)

    def _grid_after(self, t: float) -> float:
        if self._decode_s <= 0:
            return t
        return self._epoch + (math.floor((t - self._epoch) / self._decode_s) + 1) * self._decode_s

    def _finish(self, req: EngineRequest, t: float) -> None:
        assert req.alloc is not None
        if req.kv is not None and req.kv.do_remote_decode:
            req.block_ids = [b.block_id for b in req.alloc.blocks]
        self.cache.free(req.alloc)
        req.alloc = None
        req.state = RequestState.FINISHED
        req.finished_at = t
        self._running.pop(req.request_id, None)
        self.counters.requests_finished += 1
        self.counters.generation_tokens_total += req.max_tokens
        if not req.first_token.done():
            req.first_token.set_result(None)
        if not req.done.done():
            req.done.set_result(None)

    def _flush(self) -> None:
        events = self.cache.take_events()
        if events:
            self.publisher.publish(events)

    def _abort_all(self, reason: str) -> None:
        for req in [*self._waiting, *self._running.values()]:
            self.abort(req, reason)

    def _reset_schedule(self) -> None:
        self._waiting.clear()
        self._running.clear()
        self._prefill_queue.clear()
        self._prefilling = None
        self._lane_free_at = 0.0
        self._heap.clear()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._loop is not None:
            self._epoch = self._loop.time()
