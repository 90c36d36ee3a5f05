"""Apply decoded KV events to the index, exactly as llm-d's ``kvevents.Pool`` does (plus its fixes).

BlockStored recomputes request keys from the event's tokens (engine and indexer hashes never need to
agree), chains from the parent through the engine-key mapping, and maps engine keys to request keys.
BlockRemoved is reference-counted per (endpoint, tier, group, rank, hash), because vLLM can store
the same hash twice. AllBlocksCleared clears the endpoint. Spec: ``block_keys_and_index.md`` §3.

Not thread-safe: one applier is driven by the single ingestion thread (the index itself is
thread-safe for the readers on the request path).
"""

from __future__ import annotations

from dataclasses import dataclass

import structlog

from ppc_extproc.blockkeys import TokenProcessor, parse_raw_extra_keys, realign_extras, tokens_to_le32
from ppc_extproc.events.stats import IngestStats
from ppc_extproc.events.wire import BlockRemoved, BlockStored, EventBatch
from ppc_extproc.ids import EndpointId, EngineKey
from ppc_extproc.index import EngineScope, InMemoryIndex, PodEntry

__all__ = ["INDEXABLE_KINDS", "EventApplier"]

log = structlog.get_logger(__name__)

#: HMA group kinds whose blocks form a prefix that a new request can reuse.
INDEXABLE_KINDS = frozenset({"full_attention", "mla_attention", "sink_full_attention"})

_DedupKey = tuple[str, int | None, int, int]  # (tier, group, dp_rank, engine hash)


@dataclass(slots=True)
class _GroupInfo:
    kind: str
    block_size: int
    sliding_window: int | None


class EventApplier:
    """Applies ``EventBatch``es of one or many endpoints to an ``InMemoryIndex``."""

    def __init__(
        self,
        index: InMemoryIndex,
        processor: TokenProcessor,
        stats: IngestStats | None = None,
    ) -> None:
        self.index = index
        self.processor = processor
        self.stats = stats or IngestStats()
        # Extra copies of a stored hash beyond the first, per endpoint (usually empty).
        self._duplicates: dict[str, dict[_DedupKey, int]] = {}
        self._groups: dict[tuple[str, int], _GroupInfo] = {}
        # Interned entries and scopes: an event needs one of each, thousands of times a second.
        self._entries: dict[tuple[str, str, int | None], PodEntry] = {}
        self._scopes: dict[tuple[str, int, int | None], EngineScope] = {}

    def _entry(self, endpoint: str, medium: str | None, group: int | None) -> PodEntry:
        tier = medium.lower() if medium else "gpu"
        entry = self._entries.get((endpoint, tier, group))
        if entry is None:
            if len(self._entries) > 65536:
                self._entries.clear()
            entry = self._entries[(endpoint, tier, group)] = PodEntry(EndpointId(endpoint), tier, group=group)
        return entry

    def _scope(self, endpoint: str, rank: int, group: int | None) -> EngineScope:
        scope = self._scopes.get((endpoint, rank, group))
        if scope is None:
            if len(self._scopes) > 65536:
                self._scopes.clear()
            scope = self._scopes[(endpoint, rank, group)] = EngineScope(EndpointId(endpoint), rank, group)
        return scope

    # --- endpoint lifecycle --------------------------------------------------------------------

    def clear_endpoint(self, endpoint: str) -> int:
        """Forget everything an endpoint holds (AllBlocksCleared, engine restart)."""
        self._duplicates.pop(endpoint, None)
        return self.index.clear(endpoint)

    def forget_endpoint(self, endpoint: str) -> int:
        """Endpoint deleted from the pool: clear it and recycle its index entries."""
        self._duplicates.pop(endpoint, None)
        for key in [k for k in self._groups if k[0] == endpoint]:
            del self._groups[key]
        return self.index.forget_endpoint(endpoint)

    # --- batches -------------------------------------------------------------------------------

    def apply_batch(self, endpoint: str, model: str, batch: EventBatch) -> None:
        """Apply one batch of ``endpoint``'s events. ``model`` is the topic's model segment."""
        stats = self.stats
        for reason in batch.skipped:
            stats.drop(endpoint, reason)
        rank = batch.data_parallel_rank
        stored = removed = blocks = 0
        for event in batch.events:
            try:
                if isinstance(event, BlockStored):
                    blocks += self._stored(endpoint, model, rank, event)
                    stored += 1
                elif isinstance(event, BlockRemoved):
                    self._removed(endpoint, rank, event)
                    removed += 1
                else:
                    self.clear_endpoint(endpoint)
                    stats.event(endpoint, "AllBlocksCleared")
            except Exception:  # one bad event never stops the batch
                stats.drop(endpoint, "apply_error")
                log.warning("kv_event_apply_failed", endpoint=endpoint, exc_info=True)
        if stored:
            stats.event(endpoint, "BlockStored", stored)
            if blocks:
                stats.count(endpoint, "blocks_stored", blocks)
        if removed:
            stats.event(endpoint, "BlockRemoved", removed)

    # --- events --------------------------------------------------------------------------------

    def _indexable_group(self, endpoint: str, event: BlockStored | BlockRemoved) -> bool:
        group = event.group_idx
        if group is None:
            return True
        info = self._groups.get((endpoint, group))
        if isinstance(event, BlockStored) and event.kv_cache_spec_kind is not None:
            if info is None or info.kind != event.kv_cache_spec_kind:
                self._groups[(endpoint, group)] = _GroupInfo(
                    event.kv_cache_spec_kind, event.block_size, event.kv_cache_spec_sliding_window
                )
            return event.kv_cache_spec_kind in INDEXABLE_KINDS
        if info is None:
            # vLLM before 0.22 tags groups without kinds; group 0 is the full-attention group.
            return isinstance(event, BlockStored) and event.kv_cache_spec_kind is None and group == 0
        return info.kind in INDEXABLE_KINDS

    def _stored(self, endpoint: str, model: str, rank: int, event: BlockStored) -> int:
        """Apply one BlockStored; returns the number of canonical blocks indexed."""
        stats = self.stats
        if event.group_idx is not None and not self._indexable_group(endpoint, event):
            stats.drop(endpoint, "non_indexable_group")
            return 0
        n_hashes = len(event.block_hashes)
        n_tokens = len(event.token_ids)
        if (
            event.group_idx is not None
            and n_tokens
            and event.block_size > 0
            and (n_tokens % event.block_size or n_tokens // event.block_size != n_hashes)
        ):
            stats.drop(endpoint, "sparse_group_event")
            return 0
        entry = self._entry(endpoint, event.medium, event.group_idx)
        scope = self._scope(endpoint, rank, event.group_idx)
        parent_key = 0
        if event.parent_block_hash:
            parent = self.index.get_request_key(EngineKey(event.parent_block_hash), scope)
            if parent is None:
                stats.drop(endpoint, "unknown_parent")
                return 0
            parent_key = parent

        if n_tokens == 0:
            if n_hashes:
                self._tier_update(scope, entry, event)
            return 0

        block = self.processor.block_size
        n_canonical = n_tokens // block
        if n_canonical == 0:
            stats.drop(endpoint, "shorter_than_block")
            return 0
        try:
            tokens = tokens_to_le32(event.token_ids)
        except (OverflowError, TypeError):
            stats.drop(endpoint, "bad_token_ids")
            return 0
        extras = None
        raw_extras = event.extra_keys
        if raw_extras is not None and raw_extras.count(None) != len(raw_extras):  # vLLM sends [None, …]
            extras = realign_extras(parse_raw_extra_keys(raw_extras, event.lora_name), n_canonical)
        if event.cache_salt and event.parent_block_hash is None and n_canonical:
            extras = list(extras) if extras else [None] * n_canonical
            extras[0] = (*(extras[0] or ()), event.cache_salt)
        keys = self.processor.keys(tokens, event.lora_name or model, parent=parent_key, extras=extras)

        engine_keys: list[int] | None = event.block_hashes
        if n_hashes and n_tokens % n_hashes == 0:
            engine_block = n_tokens // n_hashes
            if engine_block < block:
                # Map only engine blocks whose tokens lie inside full canonical blocks.
                engine_keys = event.block_hashes[: len(keys) * block // engine_block]
        else:
            engine_keys = None  # tokens do not split evenly into engine blocks: no safe mapping
        duplicates = self.index.add(engine_keys, keys, [entry], scope)  # type: ignore[arg-type]
        if duplicates:
            counts = self._duplicates.setdefault(endpoint, {})
            for engine_key in duplicates:
                dkey = (entry.tier, event.group_idx, rank, engine_key)
                counts[dkey] = counts.get(dkey, 0) + 1
        return len(keys)

    def _tier_update(self, scope: EngineScope, entry: PodEntry, event: BlockStored) -> None:
        """A token-less BlockStored (offload, location only): add the tier to mapped blocks."""
        keys = []
        for engine_key in event.block_hashes:
            key = self.index.get_request_key(EngineKey(engine_key), scope)
            if key is not None and key not in keys:
                keys.append(key)
        if keys:
            self.index.add(None, keys, [entry])

    def _removed(self, endpoint: str, rank: int, event: BlockRemoved) -> None:
        stats = self.stats
        if event.group_idx is not None:
            info = self._groups.get((endpoint, event.group_idx))
            if info is not None and info.kind not in INDEXABLE_KINDS:
                stats.drop(endpoint, "non_indexable_group")
                return
            if info is None and event.group_idx != 0:
                stats.drop(endpoint, "unknown_group")
                return
        entry = self._entry(endpoint, event.medium, event.group_idx)
        scope = self._scope(endpoint, rank, event.group_idx)
        tier = entry.tier
        counts = self._duplicates.get(endpoint)
        for engine_key in event.block_hashes:
            if counts:
                dkey = (tier, event.group_idx, rank, engine_key)
                extra = counts.get(dkey, 0)
                if extra:
                    if extra == 1:
                        del counts[dkey]
                    else:
                        counts[dkey] = extra - 1
                    stats.count(endpoint, "removes_suppressed")
                    continue
            if not self.index.evict_engine_key(EngineKey(engine_key), scope, [entry]):
                stats.count(endpoint, "removes_unmapped")
