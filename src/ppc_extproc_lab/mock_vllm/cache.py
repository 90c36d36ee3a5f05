"""A bounded GPU prefix cache with vLLM's block-pool behaviour and KV events
(``vllm-project/vllm: vllm/v1/core/block_pool.py``, ``kv_cache_manager.py``).

* A request hits the longest run of cached full blocks of its prompt, capped so that at most
  ``len(prompt) - 1`` tokens count as computed (the last token is always recomputed).
* Blocks of running requests are pinned (ref-counted). A finished request's blocks become
  free; full (hashed) blocks stay cached in LRU order, its tail blocks first so they are
  evicted first, like vLLM's ``KVCacheManager.free``.
* Allocation takes free uncached blocks first, then evicts the least-recently-used free
  cached block and emits ``BlockRemoved([hash])`` — one event per evicted block, before the
  ``BlockStored`` of the allocation that needed it.
* Newly full blocks are stored with one ``BlockStored`` per call of :meth:`PrefixCache.advance`
  (parent = hash of the block before). The same hash can be cached twice (no dedup).

Admission reserves every block a request will ever need, so a running request never has
to be preempted; the blocks themselves are taken (and evictions happen) lazily.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import msgspec

from ppc_extproc_lab.mock_vllm.hashing import BlockHasher, block_extra_keys, event_extra_keys, wire_hash
from ppc_extproc_lab.mock_vllm.kv_events import (
    MEDIUM_GPU,
    SPEC_KIND_FULL_ATTENTION,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
)

__all__ = ["Allocation", "CacheEvent", "CacheStats", "CapacityError", "PrefixCache"]

CacheEvent = BlockStored | BlockRemoved | AllBlocksCleared


#: (group, kind, sliding window in blocks or 0) of the extra groups of a hybrid engine.
_HYBRID_GROUPS = ((1, "sliding_window", 4), (2, "mamba", 0))


class CapacityError(ValueError):
    """The request needs more blocks than the whole cache has; it can never run."""


@dataclass(slots=True, eq=False)
class _Block:
    block_id: int
    ref_cnt: int = 0
    digest: bytes | None = None


@dataclass(slots=True, eq=False)
class Allocation:
    """The blocks held by one running request."""

    cache_salt: str | None
    #: Digests of the request's full blocks known so far (prompt blocks, then generated ones).
    digests: list[bytes]
    #: Leading blocks that were prefix-cache hits.
    num_hit: int
    #: Blocks of the request that are cached (hit or stored); ``blocks[:num_cached]``.
    num_cached: int
    #: Blocks admitted but not yet taken from the pool.
    reserved: int
    block_size: int
    blocks: list[_Block] = field(default_factory=list)

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens served from the prefix cache (``num_hit * block_size``)."""
        return self.num_hit * self.block_size


@dataclass(frozen=True, slots=True)
class CacheStats:
    """A snapshot of the pool."""

    num_blocks: int
    used: int
    cached: int
    free_cached: int
    free_uncached: int
    reserved: int
    evictions: int

    @property
    def usage(self) -> float:
        """Fraction of blocks held by requests (vLLM's ``kv_cache_usage_perc``, 0..1)."""
        return self.used / self.num_blocks if self.num_blocks else 0.0


class PrefixCache:
    """The block pool of one engine; events accumulate until :meth:`take_events`."""

    def __init__(
        self, num_blocks: int, block_size: int, hasher: BlockHasher | None = None, *, hybrid: bool = False
    ) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.hasher = hasher or BlockHasher(block_size)
        #: Also publish the events of a sliding-window group (1) and a Mamba group (2).
        self.hybrid = hybrid
        if self.hasher.block_size != block_size:
            raise ValueError("hasher block size differs from the cache's")
        self._init_pool()

    def _init_pool(self) -> None:
        self._blocks = [_Block(i) for i in range(self.num_blocks)]
        self._free_uncached: deque[_Block] = deque(self._blocks)
        self._free_cached: OrderedDict[int, _Block] = OrderedDict()  # LRU first
        self._by_digest: dict[bytes, dict[int, _Block]] = {}
        self._num_cached = 0
        self._reserved = 0
        self._events: list[CacheEvent] = []
        self.evictions = 0

    # ---------------------------------------------------------------- queries (no side effects)

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks needed to hold ``num_tokens`` tokens of KV."""
        return -(-num_tokens // self.block_size)

    def longest_hit(self, digests: Sequence[bytes], num_prompt_tokens: int) -> int:
        """Leading cached blocks of a prompt, capped at ``(num_prompt_tokens - 1) // block_size``."""
        cap = max(num_prompt_tokens - 1, 0) // self.block_size
        n = 0
        for d in digests[:cap]:
            if d not in self._by_digest:
                break
            n += 1
        return n

    def match(self, tokens: Sequence[int], cache_salt: str | None = None) -> tuple[int, int]:
        """``(cached_tokens, matched_tokens)`` for a prompt: the capped hit a request would get
        now, and the uncapped run of cached full blocks, both in tokens."""
        digests = self.hasher.hash_blocks(tokens, cache_salt)
        matched = 0
        for d in digests:
            if d not in self._by_digest:
                break
            matched += 1
        capped = min(matched, max(len(tokens) - 1, 0) // self.block_size)
        return capped * self.block_size, matched * self.block_size

    def stats(self) -> CacheStats:
        """Current block counts."""
        free = len(self._free_uncached) + len(self._free_cached)
        return CacheStats(
            num_blocks=self.num_blocks,
            used=self.num_blocks - free,
            cached=self._num_cached,
            free_cached=len(self._free_cached),
            free_uncached=len(self._free_uncached),
            reserved=self._reserved,
            evictions=self.evictions,
        )

    def lru_order(self) -> list[int]:
        """Wire hashes of the free cached blocks, next eviction first (for tests and debugging)."""
        return [wire_hash(b.digest) for b in self._free_cached.values() if b.digest is not None]

    # ---------------------------------------------------------------- request lifecycle

    def try_admit(
        self,
        prompt_digests: list[bytes],
        num_prompt_tokens: int,
        num_kv_tokens: int,
        cache_salt: str | None = None,
    ) -> Allocation | None:
        """Pin the prompt's cache hit and reserve the rest of the request's blocks.

        ``num_kv_tokens`` is every token that will ever have KV (prompt + outputs − 1).
        Returns None when the blocks are not available now; raises :class:`CapacityError`
        when they never will be.
        """
        total = self.blocks_for(num_kv_tokens)
        if total > self.num_blocks:
            raise CapacityError(
                f"request needs {total} KV blocks of {self.block_size} tokens "
                f"but the cache has {self.num_blocks}"
            )
        num_hit = self.longest_hit(prompt_digests, num_prompt_tokens)
        hits = [next(iter(self._by_digest[d].values())) for d in prompt_digests[:num_hit]]
        free_hits = sum(1 for b in hits if b.ref_cnt == 0)
        need = total - num_hit
        available = len(self._free_uncached) + len(self._free_cached) - self._reserved - free_hits
        if need > available:
            return None
        for b in hits:
            self._touch(b)
        self._reserved += need
        return Allocation(
            cache_salt=cache_salt,
            digests=list(prompt_digests),
            num_hit=num_hit,
            num_cached=num_hit,
            reserved=need,
            block_size=self.block_size,
            blocks=hits,
        )

    def extend_hit(self, alloc: Allocation, num_prompt_tokens: int) -> int:
        """Grow a not-yet-started request's hit over blocks cached since admission (by requests
        ahead of it in the prefill lane) and release their reservation; returns ``num_hit``."""
        if len(alloc.blocks) != alloc.num_hit:
            raise RuntimeError("extend_hit after blocks were allocated")
        cap = min(max(num_prompt_tokens - 1, 0) // self.block_size, len(alloc.digests))
        while alloc.num_hit < cap and alloc.reserved > 0:
            copies = self._by_digest.get(alloc.digests[alloc.num_hit])
            if not copies:
                break
            block = next(iter(copies.values()))
            self._touch(block)
            alloc.blocks.append(block)
            alloc.num_hit += 1
            alloc.num_cached += 1
            alloc.reserved -= 1
            self._reserved -= 1
        return alloc.num_hit

    def advance(self, alloc: Allocation, tokens: Sequence[int], num_computed: int, *, publish: bool = True) -> None:
        """The first ``num_computed`` of ``tokens`` now have KV: take blocks to hold them
        (evicting as needed) and store every newly full block with one ``BlockStored``.

        ``publish=False`` caches the blocks without the event: KV received from a remote prefill,
        which vLLM's decode side never reports (llm-d/llm-d-kv-cache issue #372)."""
        missing = self.blocks_for(num_computed) - len(alloc.blocks)
        for _ in range(missing):
            alloc.blocks.append(self._take_block(alloc))
        num_full = num_computed // self.block_size
        if num_full <= alloc.num_cached:
            return
        bs = self.block_size
        first = alloc.num_cached
        for j in range(len(alloc.digests), num_full):
            parent = alloc.digests[j - 1] if j else None
            extra = block_extra_keys(j, alloc.cache_salt)
            alloc.digests.append(
                self.hasher.hash_block(parent, tokens[j * bs : (j + 1) * bs], extra)
            )
        new_digests = alloc.digests[first:num_full]
        for j, d in enumerate(new_digests, start=first):
            block = alloc.blocks[j]
            block.digest = d
            self._by_digest.setdefault(d, {})[block.block_id] = block
            self._num_cached += 1
        alloc.num_cached = num_full
        if not publish:
            return
        parent_digest = alloc.digests[first - 1] if first else None
        self._events.append(
            BlockStored(
                block_hashes=[wire_hash(d) for d in new_digests],
                parent_block_hash=wire_hash(parent_digest) if parent_digest is not None else None,
                token_ids=list(tokens[first * bs : num_full * bs]),
                block_size=bs,
                lora_id=None,
                medium=MEDIUM_GPU,
                lora_name=None,
                extra_keys=[event_extra_keys(j, alloc.cache_salt) for j in range(first, num_full)],
                group_idx=0,
                kv_cache_spec_kind=SPEC_KIND_FULL_ATTENTION,
            )
        )
        if self.hybrid:
            stored = self._events[-1]
            assert isinstance(stored, BlockStored)
            for group, kind, window in _HYBRID_GROUPS:
                self._events.append(
                    msgspec.structs.replace(
                        stored,
                        block_hashes=[h ^ group for h in stored.block_hashes],
                        parent_block_hash=None if stored.parent_block_hash is None else stored.parent_block_hash ^ group,
                        group_idx=group,
                        kv_cache_spec_kind=kind,
                        kv_cache_spec_sliding_window=window * bs if window else None,
                    )
                )

    def free(self, alloc: Allocation) -> None:
        """Release a finished (or aborted) request's blocks and unused reservation."""
        for block in reversed(alloc.blocks):
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                if block.digest is not None:
                    self._free_cached[block.block_id] = block
                else:
                    self._free_uncached.append(block)
        alloc.blocks = []
        self._reserved -= alloc.reserved
        alloc.reserved = 0

    # ---------------------------------------------------------------- whole-cache operations

    def reset(self) -> bool:
        """vLLM's ``reset_prefix_cache``: only when no block is in use; emits AllBlocksCleared."""
        if any(b.ref_cnt for b in self._blocks) or self._reserved:
            return False
        for block in self._free_cached.values():
            block.digest = None
            self._free_uncached.append(block)
        self._free_cached.clear()
        self._by_digest.clear()
        self._num_cached = 0
        self._events.append(AllBlocksCleared())
        return True

    def drop(self) -> None:
        """Forget everything without an event, as an engine restart does (allocations are void)."""
        self._init_pool()

    def take_events(self) -> list[CacheEvent]:
        """The events since the last call, in emission order."""
        events, self._events = self._events, []
        return events

    # ---------------------------------------------------------------- internals

    def _touch(self, block: _Block) -> None:
        if block.ref_cnt == 0:
            del self._free_cached[block.block_id]
        block.ref_cnt += 1

    def _take_block(self, alloc: Allocation) -> _Block:
        if alloc.reserved <= 0:
            raise RuntimeError("allocation exceeds its reservation")
        if self._free_uncached:
            block = self._free_uncached.popleft()
        else:
            _, block = self._free_cached.popitem(last=False)
            self._evict(block)
        alloc.reserved -= 1
        self._reserved -= 1
        block.ref_cnt = 1
        return block

    def _evict(self, block: _Block) -> None:
        digest = block.digest
        if digest is None:
            return
        copies = self._by_digest[digest]
        del copies[block.block_id]
        if not copies:
            del self._by_digest[digest]
        block.digest = None
        self._num_cached -= 1
        self.evictions += 1
        self._events.append(
            BlockRemoved(block_hashes=[wire_hash(digest)], medium=MEDIUM_GPU, group_idx=0)
        )
        if self.hybrid:
            for group, _, _ in _HYBRID_GROUPS:
                self._events.append(
                    BlockRemoved(block_hashes=[wire_hash(digest) ^ group], medium=MEDIUM_GPU, group_idx=group)
                )
