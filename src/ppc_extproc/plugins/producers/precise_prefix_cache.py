"""``precise-prefix-cache-producer``: prefix match per endpoint from the KV-event-fed index.

Type        ``precise-prefix-cache-producer`` (producer; also an endpoint extractor and a
            pre-request hook)
Consumes    ``TokenizedPrompt`` — exact token ids only (from the body or an exact token producer;
            estimated ids are ignored: they could never match a KV event)
produce     tokens → request keys → index lookup → ``PrefixCacheMatchInfo`` for every candidate
            under ``PrefixCacheMatchInfoDataKey/<name>``: matchBlocks = int(tier-weighted longest
            consecutive prefix), totalBlocks, blockSizeTokens, cachedBlockCount,
            cachedBlocksByTier (summed over the prompts of a batched request)
arrival     the KV-event thread reads what its batch window gathered, as the request's headers
            arrive (``ZmqTransport.flush``); ``produce`` waits for that read (at most 1 ms)
pre_request seed speculative entries (tier "", weight 1.0) for the picked endpoint when
            ``speculativeIndexing``, on every key of every prompt past the leading blocks it already
            holds at that weight (confirmed or seeded); they expire after ``speculativeTTL``
extract     endpoint add/update/delete: KV-event subscribers follow the endpoint set; a deleted
            endpoint's index entries are cleared
Parameters  (llm-d's names; defaults in brackets)
            ``tokenProcessorConfig``: ``blockSizeTokens`` [16; use the engines' --block-size],
              ``hashSeed`` [""], ``hashAlgorithm`` [xxh64; ``cbor-fnv`` is llm-d's default]
            ``indexerConfig``: ``kvBlockIndexConfig.inMemoryConfig.size`` [10,000,000 keys],
              ``podCacheSize`` [10 entries per key], ``kvCacheBackendConfigs`` [gpu 1.0, cpu 0.8]
            ``kvEventsConfig``: ``zmqEndpoint`` [""; set ⇒ central mode], ``topicFilter`` [kv@],
              ``engineType`` [vllm|sglang], ``discoverPods`` [true],
              ``podDiscoveryConfig.socketPort`` [5557], ``replaySocketPort`` [0 = off; < 0 = off, as llm-d],
              ``queueSize`` [10000 messages per source], central mode only:
              ``curveConfig.serverSecretKeyFile``, ``curveConfig.allowedPublisherKeys`` [unset =
              no CURVE; then a bind beyond loopback needs ``allowUnauthenticatedPublishers``
              [false]]
            ``speculativeIndexing`` [false], ``speculativeTTL`` ["2s"]
            ppc-extproc's: ``creditDecodeEngine`` [true; false = llm-d: a P/D decode engine is
              never credited with the prompt it receives], ``decodeCreditTTL`` ["120s": how long
              that credit and its pending transfer last unconfirmed]
Streaming   for token-id bodies of 64 KiB or more, block keys are computed while the body streams
            in (``streaming_processor``); ``produce`` then only looks them up

    plugins:
    - type: precise-prefix-cache-producer
      parameters:
        tokenProcessorConfig: {blockSizeTokens: 64}
        speculativeIndexing: true
        kvEventsConfig:
          podDiscoveryConfig: {socketPort: 5556, replaySocketPort: 5559}

Follows ``llm-d/llm-d-router: pkg/epp/framework/plugins/requestcontrol/dataproducer/preciseprefixcache/``
and the indexer in ``pkg/kvcache/``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from ppc_extproc.blockkeys import TokenProcessor, compute_block_extras, fold_cache_salt
from ppc_extproc.events.apply import EventApplier
from ppc_extproc.events.null_transport import EventTransport, NullTransport
from ppc_extproc.events.stats import IngestStats
from ppc_extproc.events.transfers import Transfer
from ppc_extproc.framework import (
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
    Lifecycle,
    PluginState,
    PreRequest,
    RequestArrival,
    ResponseComplete,
    ResponseInfo,
    SchedulingContext,
    SchedulingResult,
    StateReporter,
    StreamingKeyProducer,
    Ticker,
)
from ppc_extproc.framework.params import Section
from ppc_extproc.ids import EndpointId, RequestKey
from ppc_extproc.index import InMemoryIndex, PrefixRun, SpeculativeIndexer
from ppc_extproc.index.speculative import Seeded
from ppc_extproc.matchinfo import (
    PrefixCacheMatchInfo,
    PrefixScore,
    engine_cached_tokens,
    score_prefix_runs,
)
from ppc_extproc.plugins.producers.precise_prefix_cache_config import (
    PrecisePrefixCacheProducerConfig,
    parse_producer_config,
)
from ppc_extproc.plugins.registry import Services, register
from ppc_extproc.tokens import TokenizedPrompt

if TYPE_CHECKING:
    from ppc_extproc.events.snapshot_format import IndexState
    from ppc_extproc.events.transport import ZmqTransport
    from ppc_extproc.events.warm_restart import SnapshotWriter

__all__ = ["PRECISE_BLOCK_KEYS", "PrecisePrefixCacheProducer"]



def _summed(per_prompt: list[dict[EndpointId, PrefixScore]]) -> dict[EndpointId, PrefixScore]:
    """Longest-prefix scores per endpoint, summed over the prompts of a batch in prompt order."""
    total: dict[EndpointId, PrefixScore] = {}
    for scores in per_prompt:
        for endpoint, score in scores.items():
            summed = total.setdefault(endpoint, PrefixScore())
            summed.weighted += score.weighted
            summed.blocks += score.blocks
            for tier, n in score.blocks_by_tier.items():
                summed.blocks_by_tier[tier] = summed.blocks_by_tier.get(tier, 0) + n
    return total

log = structlog.get_logger(__name__)

# Per request, under the producer's name: what the lookup leaves for the hooks after the pick.
_BLOCK_KEYS: DataType[list[list[RequestKey]]] = DataType("PreciseBlockKeys")
#: The request's block keys per prompt, as this producer computed them (a cross-replica syncer
#: claims the prompt's prefix with them).
PRECISE_BLOCK_KEYS = _BLOCK_KEYS
_PREFIX_RUNS: DataType[list[list[PrefixRun]]] = DataType("PrecisePrefixRuns")
_SEEDED: DataType[Seeded] = DataType("PreciseSpeculativeEntries")
_TRANSFER: DataType[tuple[EndpointId, Transfer]] = DataType("PreciseKvTransfer")
#: Longest time between two reports of every subscriber's connection to endpoint health.
_RECONCILE_SECONDS = 1.0


@register("precise-prefix-cache-producer")
class PrecisePrefixCacheProducer(
    DataProducer, RequestArrival, PreRequest, ResponseComplete, EndpointExtractor, Lifecycle, Ticker,
    StateReporter, StreamingKeyProducer,
):
    """Writes ``PrefixCacheMatchInfoDataKey/<name>`` for every candidate endpoint."""

    def __init__(
        self,
        name: str = "precise-prefix-cache-producer",
        config: PrecisePrefixCacheProducerConfig | None = None,
        services: Services | None = None,
    ) -> None:
        self.name = name
        self.config = config or PrecisePrefixCacheProducerConfig()
        services = services or Services()
        self.match_key = PREFIX_CACHE_MATCH_INFO.of(name)
        self.processor = TokenProcessor(self.config.token_processor)
        self.index = InMemoryIndex(
            size=self.config.indexer.size,
            pod_cache_size=self.config.indexer.pod_cache_size,
            tier_weights=self.config.indexer.tier_weights,
        )
        self.stats = IngestStats()
        self.applier = EventApplier(self.index, self.processor, self.stats)
        self.speculative = SpeculativeIndexer(
            self.index, self.config.speculative_ttl_seconds, clock=services.clock
        )
        # The decode-engine credit lives as long as its pending transfer, not ``speculativeTTL``:
        # a turn that queues, or an answer that never fills a block (so no event confirms the
        # transfer), keeps it. Its own tier keeps its entries apart from the speculative ones.
        credit_ttl = self.config.decode_credit_ttl_seconds
        self.applier.transfers.ttl_seconds = credit_ttl
        self.credit = SpeculativeIndexer(self.index, credit_ttl, clock=services.clock, tier=CREDIT_TIER)
        #: Told whether each endpoint's KV-event subscriber is connected (per-endpoint mode): by
        #: the ingestion thread when it changes, and again by ``tick`` (a reconciliation).
        self.health = services.health
        events = self.config.kv_events
        self._reports_connections = events.discover_pods and not events.zmq_endpoint
        if self._reports_connections:
            self.stats.on_connection = self.health.kv_connection
        #: Polled engine metrics: ``vllm:cache_config_info{block_size}`` until events teach it.
        self.engine_metrics = services.engine_metrics
        #: Per request, for ``pre_request``: the block keys, and the prefix runs the lookup found
        #: (which blocks are already seeded); for ``response_complete``: the speculative entries given.
        self._keys_key = _BLOCK_KEYS.of(name)
        self._runs_key = _PREFIX_RUNS.of(name)
        self.seeded_key = _SEEDED.of(name)
        self._transfer_key = _TRANSFER.of(name)
        #: The KV-event transport (ZMQ subscribers): replaced in ``start``; until then (and after
        #: ``stop``) the null transport, which clears a deleted endpoint at once.
        self.transport: EventTransport = NullTransport(self.applier)
        #: Periodic warm-restart snapshots (``warmRestart.stateDir`` set, per-endpoint or central ZMQ).
        self.snapshots: SnapshotWriter | None = None

    @classmethod
    def from_parameters(
        cls, name: str, params: Section, services: Services
    ) -> PrecisePrefixCacheProducer:
        return cls(name, parse_producer_config(params), services)

    @property
    def block_size(self) -> int:
        return self.processor.block_size

    @property
    def streaming_processor(self) -> TokenProcessor:
        return self.processor

    def produces(self) -> frozenset[DataKey[object]]:
        return frozenset({PREFIX_CACHE_MATCH_INFO.of(self.name)})

    def consumes(self) -> tuple[Consumes[object], ...]:
        return (Consumes(TOKENIZED_PROMPT, exact_tokens=True),)

    # --- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the KV-event transport (its own subscriber thread)."""
        self.start_transport()

    def start_transport(self) -> None:
        from ppc_extproc.events.transport import ZmqTransport, create_transport  # ZMQ loads when used

        if isinstance(self.transport, NullTransport):
            self.transport = create_transport(self.config.kv_events, self.applier, self.stats)
            if isinstance(self.transport, ZmqTransport) and self.config.warm_restart.state_dir:
                self._warm_start(self.transport)
            self.transport.start()
            if self.snapshots is not None:
                self.snapshots.start()

    def _warm_start(self, transport: ZmqTransport) -> None:
        """Load the snapshot (if any) before the first endpoint is subscribed, then keep one."""
        from ppc_extproc.events.warm_restart import (
            SNAPSHOT_FILE,
            SnapshotWriter,
            config_hash,
            load_snapshot,
            take_snapshot,
        )

        warm = self.config.warm_restart
        path = Path(warm.state_dir) / SNAPSHOT_FILE
        hash_ = config_hash(self.config.token_processor)
        for leftover in path.parent.glob(f".{SNAPSHOT_FILE}.*.tmp"):  # a write cut short by kill -9
            leftover.unlink(missing_ok=True)
        load_snapshot(
            path, warm.max_bytes, hash_, self.applier, self.stats, transport.restored,
            warm.restore_ttl_seconds,
        )

        def build() -> IndexState | None:
            if not transport.running:
                return None
            return transport.on_thread(lambda sources: take_snapshot(self.applier, sources, hash_)).result(60.0)  # type: ignore[no-any-return]

        self.snapshots = SnapshotWriter(path, warm.interval_seconds, warm.max_bytes, build)

    async def stop(self) -> None:
        self.stop_transport()

    def stop_transport(self, timeout: float = 5.0) -> None:
        if self.snapshots is not None:
            self.snapshots.stop(final=True)  # on SIGTERM: the last cut, before the thread ends
            self.snapshots = None
        self.transport.stop(timeout)
        self.transport = NullTransport(self.applier)

    def request_arrived(self) -> None:
        """The KV-event thread ends its batch window's pause, so this request is decided on the
        messages that arrived before it."""
        self.transport.flush()

    def tick(self, now: float) -> float:
        """Housekeeping: expire speculative entries; report subscriber connections to endpoint
        health again (a soft signal: it corroborates connection failures, and a reconnect ends
        their hold; the ingestion thread reports each change as it happens, this catches an
        endpoint health learned of later; the entries of a disconnected endpoint are suspended by
        the ingestion). Returns when it is next due: the next speculative expiry, and within
        ``_RECONCILE_SECONDS`` while connections are reported."""
        self.speculative.expire(now)
        self.credit.expire(now)
        self.applier.transfers.expire(now)
        due = min(self.speculative.next_expiry(now), self.credit.next_expiry(now))
        if self._reports_connections and not isinstance(self.transport, NullTransport):
            self.stats.report_connections()
            due = min(due, now + _RECONCILE_SECONDS)
        return due

    def state(self, *, detailed: bool = False) -> PluginState:
        return PluginState(
            self.name, self.type_name,
            index=self.index.stats(),
            entries_per_endpoint=self.index.entries_per_endpoint() if detailed else None,
            speculative_pending=self.speculative.pending() + self.credit.pending(),
            kv_events=self.stats,
            details=(
                {"kvEvents": self.stats.snapshot(), "kvEntryTable": self.applier.entries.to_json()}
                if detailed
                else {}
            ),
        )

    # --- keys ----------------------------------------------------------------------------------

    def block_keys(self, tokenized: TokenizedPrompt) -> list[list[RequestKey]]:
        """Request keys of each prompt: multimodal extras, then ``cache_salt`` on block 0."""
        keys = []
        block = self.processor.block_size
        for i, tokens in enumerate(tokenized.prompts):
            n_tokens = len(tokens) // 4
            extras = None
            if tokenized.features and i == 0 and len(tokenized.prompts) == 1:
                extras = compute_block_extras(tokenized.features, block, n_tokens)
            extras = fold_cache_salt(extras, tokenized.cache_salt, n_tokens // block)
            keys.append(self.processor.keys(tokens, tokenized.model, extras=extras, recent=True))
        return keys

    # --- produce -------------------------------------------------------------------------------

    def produce(self, ctx: SchedulingContext) -> None:
        """Write match info for every candidate; nothing when the request has no full block."""
        tokenized = ctx.request.tokenized
        if tokenized is None or not tokenized.exact:
            return
        started = time.perf_counter()
        streamed = ctx.request.streamed_keys
        if streamed is not None and streamed.producer == self.name and streamed.model == tokenized.model:
            keys_per_prompt = [streamed.keys]
        else:
            keys_per_prompt = self.block_keys(tokenized)
        keyed = time.perf_counter()
        ctx.timings["keys"] = ctx.timings.get("keys", 0.0) + keyed - started
        total_blocks = sum(len(k) for k in keys_per_prompt)
        if total_blocks == 0:
            return
        ctx.put(self._keys_key, keys_per_prompt)
        candidates = [e.id for e in ctx.candidates]
        # The KV-event messages that were waiting when this request arrived (``request_arrived``
        # ended the batch window's pause): usually read by now, else a round of the thread away.
        self.transport.wait_flushed()
        # A subscriber that lost its engine suspends the entries until a message proves them.
        suspended = self.stats.suspended
        trusted = [c for c in candidates if c not in suspended] if suspended else candidates
        runs_per_prompt = [self.index.prefix_runs(keys, trusted) if keys else [] for keys in keys_per_prompt]
        if self.config.speculative_indexing:
            ctx.put(self._runs_key, runs_per_prompt)
        per_prompt = [score_prefix_runs(runs) for runs in runs_per_prompt]
        scores = per_prompt[0] if len(per_prompt) == 1 else _summed(per_prompt)
        mm_blocks = self._multimodal_blocks(tokenized)
        block = self.processor.block_size
        prompt_tokens = [len(p) // 4 for p in tokenized.prompts]
        engine_blocks = self.stats.block_sizes
        # One object for every endpoint that holds nothing: match infos are read, never written.
        no_match = PrefixCacheMatchInfo(0, total_blocks, block, 0, {}, None if mm_blocks is None else 0)
        single = len(per_prompt) == 1
        infos: dict[EndpointId, PrefixCacheMatchInfo] = {}
        for endpoint in candidates:
            score = scores.get(endpoint)
            if score is None:
                info = no_match
            else:
                engine_block = engine_blocks.get(endpoint) or self._polled_block_size(endpoint)
                cached = (
                    (engine_cached_tokens(score.blocks, block, prompt_tokens[0], engine_block),)
                    if single
                    else tuple(
                        engine_cached_tokens(s.blocks if (s := prompt.get(endpoint)) else 0, block, n, engine_block)
                        for prompt, n in zip(per_prompt, prompt_tokens)
                    )
                )
                info = PrefixCacheMatchInfo(
                    match_blocks=int(score.weighted),
                    total_blocks=total_blocks,
                    block_size_tokens=block,
                    cached_block_count=score.blocks,
                    cached_blocks_by_tier=score.blocks_by_tier,
                    mm_match_blocks=None if mm_blocks is None else sum(1 for b in mm_blocks if b < score.blocks),
                    cached_tokens_per_prompt=cached,
                )
            infos[endpoint] = info
        ctx.put_endpoint_values(self.match_key, infos)
        ctx.timings["lookup"] = ctx.timings.get("lookup", 0.0) + time.perf_counter() - keyed

    def _polled_block_size(self, endpoint: str) -> int | None:
        """The block size the engine's metrics report; its events win when they have taught one
        (for hybrid models the metric is the smallest group's, vllm#51163)."""
        metrics = self.engine_metrics.snapshot(endpoint)
        return metrics.block_size if metrics is not None else None

    def _multimodal_blocks(self, tokenized: TokenizedPrompt) -> list[int] | None:
        if not tokenized.features or len(tokenized.prompts) != 1:
            return None
        extras = compute_block_extras(
            tokenized.features, self.processor.block_size, len(tokenized.prompts[0]) // 4
        )
        return [i for i, ids in enumerate(extras or ()) if ids]

    # --- after the pick ------------------------------------------------------------------------

    def pre_request(self, ctx: SchedulingContext, result: SchedulingResult) -> None:
        """Seed speculative entries for the primary target: every key of every prompt beyond the
        leading blocks the lookup found it already holds at the speculative weight (a long prompt
        sent again, or a conversation's next turn on the engine that holds its history).
        Under P/D (``result.kv_source``) with ``creditDecodeEngine`` the decode target is
        credited whatever ``speculativeIndexing`` says — it receives the prompt's blocks and
        announces none of them — for ``decodeCreditTTL``, and the transfer is recorded for its
        KV events to confirm (``events.transfers``)."""
        if not result.targets:
            return
        source = result.kv_source if self.config.credit_decode_engine else None
        if not self.config.speculative_indexing and source is None:
            return
        keys_per_prompt = ctx.get(self._keys_key)
        if not keys_per_prompt:
            return
        target = result.targets[0]
        if source is not None and len(keys_per_prompt) == 1 and ctx.request.tokenized is not None:
            transfer = self._record_transfer(target.id, source, keys_per_prompt[0], ctx.request.tokenized.prompts[0])
            ctx.put(self._transfer_key, (target.id, transfer))
        seeded = self._seed(ctx, target.id, keys_per_prompt, credit=source is not None)
        if seeded is not None:
            ctx.put(self.seeded_key, seeded)

    def _seed(
        self, ctx: SchedulingContext, target: EndpointId, keys_per_prompt: list[list[RequestKey]], *, credit: bool
    ) -> Seeded | None:
        engine_block = self.stats.block_sizes.get(target)
        block = self.processor.block_size
        if engine_block and engine_block != block and ctx.request.tokenized is not None:
            # The engine will store only its own whole blocks of each prompt.
            keys_per_prompt = [
                keys[: len(p) // 4 // engine_block * engine_block // block]
                for keys, p in zip(keys_per_prompt, ctx.request.tokenized.prompts)
            ]
        if credit:
            return self.credit.seed(target, keys_per_prompt)
        runs_per_prompt = ctx.get(self._runs_key)
        if runs_per_prompt is not None:
            # The leading blocks the target already holds at the speculative entry's weight or more
            # (confirmed by its events, or seeded before: that seeding keeps its expiry) gain nothing.
            weight = self.index.registry.weight(self.speculative.tier)
            keys_per_prompt = [
                keys[_held_blocks(runs, target, weight):] for keys, runs in zip(keys_per_prompt, runs_per_prompt)
            ]
        return self.speculative.seed(target, keys_per_prompt)

    def _record_transfer(self, target: EndpointId, source: Endpoint, keys: list[RequestKey], tokens: bytes) -> Transfer:
        engine_block = self.stats.block_sizes.get(target) or self._polled_block_size(target) or self.processor.block_size
        n_tokens = len(tokens) // 4
        boundary = n_tokens // engine_block * engine_block
        transfer = Transfer(source.id, source.rank, keys, n_tokens, engine_block, tokens[boundary * 4 :])
        self.applier.transfers.record(target, transfer)
        return transfer

    def response_complete(self, ctx: SchedulingContext, info: ResponseInfo) -> None:
        """An engine that rejected the request (4xx/5xx), or a stream that ended before any
        response, never cached its prompt: take back the speculative entries it was given."""
        seeded = ctx.get(self.seeded_key)
        if seeded is not None and info.failed:
            (self.credit if seeded.entry.tier == CREDIT_TIER else self.speculative).undo(seeded)
        transfer = ctx.get(self._transfer_key)
        if transfer is not None and info.failed:
            self.applier.transfers.take(*transfer)

    # --- endpoint lifecycle --------------------------------------------------------------------

    def extract(self, event: EndpointEvent) -> None:
        """Keep KV-event subscribers and the index in step with the endpoint set."""
        endpoint = event.endpoint
        if event.kind is EndpointEventKind.DELETED:
            self.transport.remove_endpoint(endpoint)  # drains its queue, then the applier clears it
            log.info("endpoint_removed", endpoint=endpoint.id)
            return
        previous = event.previous
        if event.kind is EndpointEventKind.UPDATED and previous is not None and previous.id != endpoint.id:
            self.transport.remove_endpoint(previous)
        self.transport.add_endpoint(endpoint)


#: Tier of the decode-engine credit's speculative entries (weight 1.0 unless configured).
CREDIT_TIER = "kv-transfer"


def _held_blocks(runs: list[PrefixRun], endpoint: EndpointId, weight: float) -> int:
    """Leading blocks of a prompt on which ``endpoint`` holds an entry weighing at least ``weight``."""
    blocks = 0
    for run in runs:
        if run.info.weights.get(endpoint, -1.0) < weight:
            break
        blocks += run.count
    return blocks
