"""``approx-prefix-cache-producer``: prefix match per endpoint from this router's own routing history.

Type        ``approx-prefix-cache-producer`` (producer, with ``pre_request`` and ``extract``;
            created with defaults when a scorer reads it and it is not configured, as in llm-d)
produce     token ids → block hashes → per candidate, the longest run of the request's blocks from
            block 0 held in that endpoint's LRU ⇒ ``PrefixCacheMatchInfo`` under
            ``PrefixCacheMatchInfoDataKey/<name>`` (summed over prompts) for every candidate
pre_request record the request's block hashes in the primary target's LRU (not on dry runs)
extract     a deleted endpoint's LRU is dropped
Consumes    ``TokenizedPrompt`` (exact or estimated ids: only locality matters here); none ⇒ no
            attribute. Engine metrics (``autoTune``, optional): ``cache_config_info`` block size
            and GPU blocks, when a metrics data source is configured

Hashes: llm-d's ``prefixhash`` chain (``blockkeys.prefixhash``; the last block may be partial).

Parameters (llm-d names and defaults)
    autoTune               true   block size and LRU capacity from engine metrics when known
    blockSizeTokens        16     clamped to ≥ 64 (llm-d #1158: bounds router memory);
                                  ``blockSize`` is the deprecated alias
    maxPrefixTokensToMatch 131072 cap per prompt, in tokens (wins when > 0)
    maxPrefixBlocksToMatch 2048   cap per prompt in blocks when the token cap is 0; both 0 = none
    lruCapacityPerServer   31250  blocks remembered per endpoint without metrics

    plugins:
    - type: approx-prefix-cache-producer
      parameters: {autoTune: true, lruCapacityPerServer: 31250}
    - type: prefix-cache-scorer            # without prefixMatchInfoProducerName: reads this one

Divergences from llm-d (same results on small loads): the match is per endpoint and consecutive
(llm-d counts every endpoint holding block i while any endpoint holds it); blocks are recorded
last-to-first so LRU pressure evicts a prefix's tail before its head; autoTune capacity is
``num_gpu_blocks × engine block size ÷ blockSize`` (llm-d uses ``num_gpu_blocks`` as a count of
its larger blocks), at most 1 Mi blocks; the block size autoTune picks is kept once seen (llm-d
re-reads it from the first candidate per request, so it can change between requests).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence

import structlog

from ppc_extproc.blockkeys.prefixhash import prefix_block_hashes
from ppc_extproc.enginemetrics import EngineMetricsReader
from ppc_extproc.framework import (
    ENGINE_METRICS,
    PREFIX_CACHE_MATCH_INFO,
    TOKENIZED_PROMPT,
    Consumes,
    DataKey,
    DataProducer,
    DataType,
    Endpoint,
    EndpointEvent,
    EndpointEventKind,
    EndpointExtractor,
    PluginState,
    PreRequest,
    SchedulingContext,
    SchedulingResult,
    StateReporter,
)
from ppc_extproc.framework.params import Section
from ppc_extproc.ids import EndpointId
from ppc_extproc.matchinfo import PrefixCacheMatchInfo, engine_cached_tokens
from ppc_extproc.plugins.registry import Services, register
from ppc_extproc.tokens import TokenizedPrompt

__all__ = ["ApproxPrefixCacheProducer"]

log = structlog.get_logger(__name__)

#: Per request, under the producer's name, for ``pre_request``: block size and each prompt's hashes.
_HASHES: DataType[tuple[int, list[list[int]]]] = DataType("ApproxPrefixHashes")

MIN_BLOCK_SIZE_TOKENS = 64
DEFAULT_BLOCK_SIZE_TOKENS = 16
DEFAULT_MAX_PREFIX_BLOCKS = 2048
DEFAULT_MAX_PREFIX_TOKENS = 131072
DEFAULT_LRU_CAPACITY_PER_SERVER = 31250
MAX_LRU_CAPACITY = 1 << 20

class _EndpointBlocks:
    """One endpoint's routing history: block hashes, least recently routed first."""

    __slots__ = ("blocks", "capacity")

    def __init__(self, capacity: int) -> None:
        self.blocks: OrderedDict[int, None] = OrderedDict()
        self.capacity = capacity

    def add(self, hashes: Sequence[int]) -> None:
        blocks = self.blocks
        for h in reversed(hashes):  # block 0 ends most recent: eviction takes tails first
            blocks[h] = None
            blocks.move_to_end(h)
        while len(blocks) > self.capacity:
            blocks.popitem(last=False)

    def prefix_length(self, hashes: Sequence[int]) -> int:
        blocks = self.blocks
        n = 0
        for h in hashes:
            if h not in blocks:
                break
            n += 1
        return n


@register("approx-prefix-cache-producer")
class ApproxPrefixCacheProducer(DataProducer, PreRequest, EndpointExtractor, StateReporter):
    """Writes ``PrefixCacheMatchInfoDataKey/<name>`` for every candidate endpoint."""

    def __init__(
        self,
        name: str = "approx-prefix-cache-producer",
        *,
        auto_tune: bool = True,
        block_size_tokens: int = DEFAULT_BLOCK_SIZE_TOKENS,
        max_prefix_blocks: int = DEFAULT_MAX_PREFIX_BLOCKS,
        max_prefix_tokens: int = DEFAULT_MAX_PREFIX_TOKENS,
        lru_capacity_per_server: int = DEFAULT_LRU_CAPACITY_PER_SERVER,
        metrics: EngineMetricsReader | None = None,
    ) -> None:
        self.name = name
        self.match_key = PREFIX_CACHE_MATCH_INFO.of(name)
        self._state_key = _HASHES.of(name)
        self.auto_tune = auto_tune
        self.configured_block_size = block_size_tokens
        self.max_prefix_blocks = max_prefix_blocks
        self.max_prefix_tokens = max_prefix_tokens
        self.lru_capacity_per_server = lru_capacity_per_server or DEFAULT_LRU_CAPACITY_PER_SERVER
        #: Engine metrics for autoTune (block size, GPU blocks), or None.
        self.metrics = metrics
        self._engine_block_size: int | None = None
        self._endpoints: dict[EndpointId, _EndpointBlocks] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_parameters(cls, name: str, params: Section, services: Services) -> ApproxPrefixCacheProducer:
        auto_tune = params.boolean("autoTune", True)
        block = params.integer("blockSizeTokens", DEFAULT_BLOCK_SIZE_TOKENS, minimum=0)
        legacy = params.integer("blockSize", 0, minimum=0)
        if legacy > 0 and block == DEFAULT_BLOCK_SIZE_TOKENS:
            block = legacy  # deprecated alias, applied as llm-d does
        if block <= 0:
            block = DEFAULT_BLOCK_SIZE_TOKENS if auto_tune else MIN_BLOCK_SIZE_TOKENS
        if (params.has("blockSizeTokens") or legacy) and 0 < block < MIN_BLOCK_SIZE_TOKENS:
            params.warn("blockSizeTokens", f"{block} is raised to {MIN_BLOCK_SIZE_TOKENS} (llm-d #1158 bounds router "
                                           "memory the same way)")  # fmt: skip
        return cls(
            name,
            auto_tune=auto_tune,
            block_size_tokens=block,
            max_prefix_blocks=params.integer("maxPrefixBlocksToMatch", DEFAULT_MAX_PREFIX_BLOCKS, minimum=0),
            max_prefix_tokens=params.integer("maxPrefixTokensToMatch", DEFAULT_MAX_PREFIX_TOKENS, minimum=0),
            lru_capacity_per_server=params.integer(
                "lruCapacityPerServer", DEFAULT_LRU_CAPACITY_PER_SERVER, minimum=0
            ),
            metrics=services.engine_metrics if auto_tune else None,
        )

    def produces(self) -> frozenset[DataKey[object]]:
        return frozenset({PREFIX_CACHE_MATCH_INFO.of(self.name)})

    def consumes(self) -> tuple[Consumes[object], ...]:
        needs: list[Consumes[object]] = [Consumes(TOKENIZED_PROMPT)]
        if self.auto_tune:
            needs.append(Consumes(ENGINE_METRICS, required=False))
        return tuple(needs)

    # --- sizes ---------------------------------------------------------------------------------

    def block_size(self, candidates: Sequence[Endpoint] = ()) -> int:
        """Tokens per block: the engine's (autoTune, once seen) or the configured one, ≥ 64."""
        if self.auto_tune and self._engine_block_size is None and self.metrics is not None:
            for endpoint in candidates:
                snapshot = self.metrics.snapshot(endpoint.id)
                if snapshot is not None and snapshot.block_size:
                    self._engine_block_size = snapshot.block_size
                    log.info("approx_block_size_tuned", producer=self.name, engine_block_size=snapshot.block_size)
                    break
        size = self._engine_block_size or self.configured_block_size
        return max(MIN_BLOCK_SIZE_TOKENS, size)

    def max_blocks(self, block_size: int) -> int:
        if self.max_prefix_tokens > 0:
            return self.max_prefix_tokens // block_size
        return self.max_prefix_blocks or (1 << 62)

    def capacity(self, endpoint_id: str, block_size: int) -> int:
        """Blocks remembered for one endpoint."""
        if self.auto_tune and self.metrics is not None:
            snapshot = self.metrics.snapshot(endpoint_id)
            if snapshot is not None and snapshot.num_gpu_blocks:
                tokens = snapshot.num_gpu_blocks * (snapshot.block_size or block_size)
                return max(1, min(MAX_LRU_CAPACITY, tokens // block_size))
        return min(MAX_LRU_CAPACITY, self.lru_capacity_per_server)

    # --- produce -------------------------------------------------------------------------------

    def hashes(self, tokenized: TokenizedPrompt, block_size: int) -> list[list[int]]:
        """Block hashes of each prompt (empty prompts give an empty list)."""
        cap = self.max_blocks(block_size)
        return [prefix_block_hashes(p, tokenized.model, tokenized.cache_salt, block_size, cap) for p in tokenized.prompts]

    def produce(self, ctx: SchedulingContext) -> None:
        """Write match info for every candidate; nothing when the request has no tokens."""
        tokenized = ctx.request.tokenized
        if tokenized is None:
            return
        block_size = self.block_size(ctx.candidates)
        all_hashes = self.hashes(tokenized, block_size)
        per_prompt = [h for h in all_hashes if h]
        total = sum(len(h) for h in per_prompt)
        if total == 0:
            return
        ctx.put(self._state_key, (block_size, per_prompt))
        lengths = [len(p) // 4 for p, h in zip(tokenized.prompts, all_hashes) if h]
        with self._lock:
            histories = {e.id: self._endpoints.get(e.id) for e in ctx.candidates}
            matched = {
                ep: [blocks.prefix_length(h) for h in per_prompt] if blocks is not None else [0] * len(per_prompt)
                for ep, blocks in histories.items()
            }
        for endpoint_id, runs in matched.items():
            n = sum(runs)
            ctx.put_endpoint_value(
                endpoint_id,
                self.match_key,
                PrefixCacheMatchInfo(
                    match_blocks=n, total_blocks=total, block_size_tokens=block_size, cached_block_count=n,
                    cached_tokens_per_prompt=tuple(
                        engine_cached_tokens(r, block_size, t) for r, t in zip(runs, lengths)
                    ),
                ),
            )

    # --- after the pick ------------------------------------------------------------------------

    def pre_request(self, ctx: SchedulingContext, result: SchedulingResult) -> None:
        """Remember that the primary target now holds this request's blocks, and so does the
        prefill endpoint that computed them under P/D (``result.kv_source``), as llm-d records its
        ``prefill`` profile's pick (``approximateprefix/plugin.go``)."""
        state = ctx.get(self._state_key)
        if state is None or not result.targets:
            return
        block_size, per_prompt = state
        holders = [result.targets[0].id]
        if result.kv_source is not None and result.kv_source.id != holders[0]:
            holders.append(result.kv_source.id)
        for endpoint_id in holders:
            capacity = self.capacity(endpoint_id, block_size)
            with self._lock:
                blocks = self._endpoints.get(endpoint_id)
                if blocks is None:
                    blocks = self._endpoints[endpoint_id] = _EndpointBlocks(capacity)
                blocks.capacity = capacity
                for hashes in per_prompt:
                    blocks.add(hashes)

    # --- endpoint lifecycle --------------------------------------------------------------------

    def extract(self, event: EndpointEvent) -> None:
        """Forget a deleted endpoint's history."""
        if event.kind is EndpointEventKind.DELETED:
            with self._lock:
                self._endpoints.pop(event.endpoint.id, None)
        elif event.previous is not None and event.previous.id != event.endpoint.id:
            with self._lock:
                self._endpoints.pop(event.previous.id, None)

    def blocks_per_endpoint(self) -> dict[str, int]:
        """Remembered blocks per endpoint (debug state; never the hashes themselves)."""
        with self._lock:
            return {ep: len(b.blocks) for ep, b in self._endpoints.items()}

    def state(self, *, detailed: bool = False) -> PluginState:
        return PluginState(self.name, self.type_name, details={"blocksPerEndpoint": self.blocks_per_endpoint()})
