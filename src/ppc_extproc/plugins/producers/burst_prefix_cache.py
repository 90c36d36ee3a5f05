"""``burst-prefix-cache-producer``: co-locate bursts of prompt-sharing requests (e.g. the samples
of an RL rollout group) so a shared prefix is prefilled once, not on every replica of a cold cache.

Type        ``burst-prefix-cache-producer`` (producer; Alpha in llm-d, which loads it only with
            ``--allow-experimental-plugins`` — ppc-extproc loads it without and says so)
Consumes    ``TokenizedPrompt`` (exact or estimated ids); engine metrics (running requests per
            replica, for balancing; the loader adds a metrics source)
Produces    ``PrefixCacheMatchInfoDataKey/<name>``: ``matchBlocks = totalBlocks`` on the replica a
            request is assigned, 0 elsewhere; unassigned requests get 0 everywhere
Behaviour   the first request opens a batch window of ``windowDurationMs``; every request waits
            until it seals (a request arriving when the batch holds ``maxBatchSize`` entries gets
            no match info at once); at the seal the batch is placed as ``burst_assign.assign``
            describes. Hashes are llm-d's prefixhash chain (partial last block included), at most
            ``maxPrefixTokensToMatch / blockSizeTokens`` blocks (0 ⇒ 2048). Dry runs (debug
            scoring) do not join a batch. Pair it with
            ``prefix-cache-scorer{prefixMatchInfoProducerName: <name>}``.
Parameters  ``windowDurationMs`` [100; 1–10000], ``maxPerReplica`` [-1 = unlimited, or ≥ 1],
            ``blockSizeTokens`` [64; > 0], ``maxPrefixTokensToMatch`` [0, or ≥ blockSizeTokens],
            ``minColocateBlocks`` [0; ≥ 0], ``maxBatchSize`` [1000; -1 or ≥ 1],
            ``balanceBy`` [requests | tokens]

    plugins:
    - type: burst-prefix-cache-producer
      parameters: {windowDurationMs: 100, maxPerReplica: -1}
    - type: prefix-cache-scorer
      parameters: {prefixMatchInfoProducerName: burst-prefix-cache-producer}

Follows ``llm-d/llm-d-router: pkg/epp/framework/plugins/requestcontrol/dataproducer/burstprefix/``.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from ppc_extproc.blockkeys.prefixhash import prefix_block_hashes
from ppc_extproc.enginemetrics import EngineMetricsReader
from ppc_extproc.errors import ConfigError
from ppc_extproc.framework import (
    ENGINE_METRICS,
    PREFIX_CACHE_MATCH_INFO,
    TOKENIZED_PROMPT,
    AsyncDataProducer,
    Consumes,
    DataKey,
    Endpoint,
    SchedulingContext,
)
from ppc_extproc.framework.params import Section, decode, param
from ppc_extproc.matchinfo import PrefixCacheMatchInfo, engine_cached_tokens
from ppc_extproc.plugins.producers.burst_assign import UNLIMITED, BurstEntry, assign
from ppc_extproc.plugins.registry import Services, register

__all__ = ["BurstConfig", "BurstParameters", "BurstPrefixCacheProducer"]

DEFAULT_MAX_PREFIX_BLOCKS = 2048
_TIMEOUT_MARGIN_SECONDS = 0.3


@dataclass(frozen=True, slots=True)
class BurstConfig:
    window_seconds: float = 0.1
    max_per_replica: int = UNLIMITED
    block_size_tokens: int = 64
    max_prefix_blocks: int = DEFAULT_MAX_PREFIX_BLOCKS
    min_colocate_blocks: int = 0
    max_batch_size: int = 1000
    balance_by_tokens: bool = False


def _invalid(params: Section, key: str, rule: str, value: object) -> ConfigError:
    return ConfigError(params.child_path(key), f"invalid configuration: {key} must be {rule} (current value: {value})")


@dataclass(frozen=True, slots=True)
class BurstParameters:
    """The producer's parameters as written (``parse_burst_config`` checks them into a ``BurstConfig``)."""

    window_duration_ms: int = param("windowDurationMs", 100)
    max_per_replica: int = param("maxPerReplica", UNLIMITED)
    block_size_tokens: int = param("blockSizeTokens", 64)
    max_prefix_tokens: int = param("maxPrefixTokensToMatch", 0)
    min_colocate_blocks: int = param("minColocateBlocks", 0)
    max_batch_size: int = param("maxBatchSize", 1000)
    balance_by: str = param("balanceBy", "requests")


def parse_burst_config(params: Section) -> BurstConfig:
    given = decode(params, BurstParameters)
    window = given.window_duration_ms
    if not 1 <= window <= 10000:
        raise _invalid(params, "windowDurationMs", "> 0 and <= 10000", window)
    per_replica = given.max_per_replica
    if per_replica != UNLIMITED and per_replica < 1:
        raise _invalid(params, "maxPerReplica", "-1 (unlimited) or >= 1", per_replica)
    block = given.block_size_tokens
    if block <= 0:
        raise _invalid(params, "blockSizeTokens", "> 0", block)
    max_tokens = given.max_prefix_tokens
    if max_tokens < 0 or 0 < max_tokens < block:
        raise _invalid(params, "maxPrefixTokensToMatch", f"0 or >= blockSizeTokens ({block})", max_tokens)
    colocate = given.min_colocate_blocks
    if colocate < 0:
        raise _invalid(params, "minColocateBlocks", ">= 0", colocate)
    batch = given.max_batch_size
    if batch != -1 and batch < 1:
        raise _invalid(params, "maxBatchSize", "-1 (unlimited) or >= 1", batch)
    balance = given.balance_by or "requests"
    if balance not in ("requests", "tokens"):
        raise _invalid(params, "balanceBy", '"requests" or "tokens"', repr(balance))
    return BurstConfig(
        window_seconds=window / 1000.0,
        max_per_replica=per_replica,
        block_size_tokens=block,
        max_prefix_blocks=max_tokens // block if max_tokens else DEFAULT_MAX_PREFIX_BLOCKS,
        min_colocate_blocks=colocate,
        max_batch_size=batch,
        balance_by_tokens=balance == "tokens",
    )


@dataclass(slots=True)
class _Batch:
    entries: list[BurstEntry] = field(default_factory=list)
    sealed: asyncio.Event = field(default_factory=asyncio.Event)


@register("burst-prefix-cache-producer")
class BurstPrefixCacheProducer(AsyncDataProducer):
    def __init__(self, name: str, config: BurstConfig | None = None, metrics: EngineMetricsReader | None = None) -> None:
        self.name = name
        self.config = config or BurstConfig()
        self.metrics = metrics
        self.match_key = PREFIX_CACHE_MATCH_INFO.of(name)
        self.produce_timeout_seconds: float | None = self.config.window_seconds + _TIMEOUT_MARGIN_SECONDS
        self._batch: _Batch | None = None
        #: Requests refused because their batch was full.
        self.batch_full = 0

    @classmethod
    def from_parameters(cls, name: str, params: Section, services: Services) -> BurstPrefixCacheProducer:
        config = parse_burst_config(params)
        params.warn("", "burst-prefix-cache-producer is Alpha: llm-d loads it only with --allow-experimental-plugins")
        return cls(name, config, services.engine_metrics)

    def produces(self) -> frozenset[DataKey[object]]:
        return frozenset({PREFIX_CACHE_MATCH_INFO.of(self.name)})

    def consumes(self) -> tuple[Consumes[object], ...]:
        return (Consumes(TOKENIZED_PROMPT), Consumes(ENGINE_METRICS))

    def _running(self, endpoint: Endpoint) -> int:
        snapshot = self.metrics.snapshot(endpoint.id) if self.metrics is not None else None
        return snapshot.running or 0 if snapshot is not None and not snapshot.stale else 0

    def _seal(self, batch: _Batch) -> None:
        if self._batch is batch:
            self._batch = None
        config = self.config
        assign(batch.entries, config.max_per_replica, config.min_colocate_blocks, config.balance_by_tokens,
               self._running)  # fmt: skip
        batch.sealed.set()

    async def produce_async(self, ctx: SchedulingContext) -> None:
        tokenized = ctx.request.tokenized
        if tokenized is None or ctx.dry_run:
            return
        config = self.config
        hashes = [
            prefix_block_hashes(p, tokenized.model, tokenized.cache_salt, config.block_size_tokens,
                                config.max_prefix_blocks)
            for p in tokenized.prompts
        ]
        entry = BurstEntry(hashes, ctx.candidates)
        batch = self._batch
        if batch is None:
            batch = self._batch = _Batch()
            asyncio.get_running_loop().call_later(config.window_seconds, self._seal, batch)
        if config.max_batch_size != -1 and len(batch.entries) >= config.max_batch_size:
            self.batch_full += 1
            raise RuntimeError(f"burst prefix batch full: maxBatchSize {config.max_batch_size} reached")
        batch.entries.append(entry)
        await batch.sealed.wait()
        total = len(entry.flat)
        assigned = entry.assigned.id if entry.assigned is not None else None
        lengths = [len(p) // 4 for p in tokenized.prompts]
        for endpoint in ctx.candidates:
            here = endpoint.id == assigned
            match = total if here else 0
            cached = tuple(
                engine_cached_tokens(len(h) if here else 0, config.block_size_tokens, n) for h, n in zip(hashes, lengths)
            )
            ctx.put_endpoint_value(
                endpoint.id, self.match_key,
                PrefixCacheMatchInfo(match, total, config.block_size_tokens, cached_block_count=match,
                                     cached_tokens_per_prompt=cached),
            )
