"""Apply decoded KV events to the index, exactly as llm-d's ``kvevents.Pool`` does (plus its fixes).

BlockStored recomputes request keys from the event's tokens (engine and indexer hashes never need to
agree), chains from the parent through the engine-key mapping, and maps engine keys to request keys.
Its entry replaces the endpoint's speculative entry on those blocks in the same write (the guess is
confirmed; a CPU-only store, weighing less, leaves it), so the speculative expiry has nothing left
to do there.
BlockRemoved is reference-counted per (endpoint, tier, group, rank, hash), because vLLM can store
the same hash twice (``llm-d/llm-d-router: pkg/kvevents/event_dedup_filter.go``). AllBlocksCleared
clears the endpoint (``llm-d/llm-d-router: pkg/kvevents/pool.go``).

Everything an engine's events can make grow is bounded: distinct (tier, group) entries per
endpoint (each owns a bit of every index mask; ``EntryTable``), HMA groups per endpoint, and the
duplicate-store counts; what goes beyond is dropped and counted. The bounds degrade and recover:
GPU entries are always admitted, and clearing an endpoint (AllBlocksCleared, a confirmed restart)
resets its tables.

Not thread-safe: one applier is driven by the single ingestion thread (the index itself is
thread-safe for the readers on the request path).
"""

from __future__ import annotations

from dataclasses import dataclass

import structlog

from ppc_extproc.blockkeys import TokenProcessor, parse_raw_extra_keys, realign_extras
from ppc_extproc.events.entry_table import EntryTable
from ppc_extproc.events.stats import IngestStats
from ppc_extproc.events.transfers import Transfer, TransferLedger
from ppc_extproc.events.wire import BlockRemoved, BlockStored, EventBatch
from ppc_extproc.ids import EndpointId, EngineKey, RequestKey
from ppc_extproc.index import EngineScope, InMemoryIndex, PodEntry
from ppc_extproc.index.entries import SPECULATIVE_TIER
from ppc_extproc.tokens.le32 import tokens_to_le32

__all__ = ["INDEXABLE_KINDS", "EventApplier"]

log = structlog.get_logger(__name__)

#: HMA group kinds whose blocks form a prefix that a new request can reuse.
INDEXABLE_KINDS = frozenset({"full_attention", "mla_attention", "sink_full_attention"})
#: Distinct (tier, group) entries an endpoint may own. Real engines use a few tiers ("GPU", "CPU",
#: offload stores) times their indexable KV-cache groups; each entry owns an index bit.
MAX_ENTRIES_PER_ENDPOINT = 32
#: Distinct HMA groups recorded per endpoint (indexable or not).
MAX_GROUPS_PER_ENDPOINT = 64
#: Duplicate-store counts kept per endpoint; beyond, they are reset (a later remove may then
#: remove a block that is still stored once: a missed hit, never a wrong one).
MAX_DUPLICATES_PER_ENDPOINT = 65536

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
        self._group_counts: dict[str, int] = {}
        # Interned scopes: an event needs one, thousands of times a second.
        self._scopes: dict[tuple[str, int, int | None], EngineScope] = {}
        # Per entry: what its stores supersede (the endpoint's speculative entry, when the stored
        # entry weighs at least as much), interned like the scopes.
        self._replacing: dict[PodEntry, tuple[PodEntry, ...]] = {}
        #: The (tier, group) entries each endpoint owns (bounded by MAX_ENTRIES_PER_ENDPOINT).
        self.entries = EntryTable(MAX_ENTRIES_PER_ENDPOINT)
        #: Blocks decode engines received under P/D: what their unknown parents may be.
        self.transfers = TransferLedger()

    def _entry(self, endpoint: str, medium: str | None, group: int | None, *, new: bool = True) -> PodEntry | None:
        """The endpoint's entry; None when the table refuses it (or, with ``new`` False, when the
        endpoint does not own it)."""
        tier = medium.lower() if medium else "gpu"
        entry = self.entries.get(endpoint, tier, group)
        if entry is None and new:
            entry, evicted = self.entries.admit(endpoint, tier, group)
            if evicted is not None:
                self.index.release_entry(evicted)
                self.stats.count(endpoint, "entries_evicted")
                log.info("kv_entry_evicted", endpoint=endpoint, tier=evicted.tier, group=evicted.group)
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
        """Forget everything an endpoint holds (AllBlocksCleared, a confirmed engine restart): its
        index entries, their bits, its entry and group tables. Returns the request keys touched."""
        return self.forget_endpoint(endpoint)

    def remove_endpoint(self, endpoint: str) -> int:
        """The endpoint left the pool: the one place its removal ends, whoever notices it (the
        producer, a transport, a subscriber, the ingestion). Clears its index state and forgets its
        KV-event counters. Returns the request keys touched."""
        touched = self.forget_endpoint(endpoint)
        self.stats.forget(endpoint)
        return touched

    def forget_endpoint(self, endpoint: str) -> int:
        """Clear an endpoint's index state and recycle its index entries (its counters stay)."""
        self._duplicates.pop(endpoint, None)
        self.transfers.forget(endpoint)
        self.entries.reset(endpoint)
        for group_key in [k for k in self._groups if k[0] == endpoint]:
            del self._groups[group_key]
        self._group_counts.pop(endpoint, None)
        self.stats.block_sizes.pop(endpoint, None)  # a restarted engine may use another size
        return self.index.forget_endpoint(endpoint)

    # --- warm restart ----------------------------------------------------------------------------

    def export_tables(
        self, endpoint: str
    ) -> tuple[
        list[tuple[str, int | None, int]],
        list[tuple[int, str, int, int | None]],
        list[tuple[str, int | None, int, int, int]],
    ]:
        """The endpoint's entry, group and duplicate tables (a warm-restart snapshot)."""
        groups = [(g, i.kind, i.block_size, i.sliding_window) for (e, g), i in self._groups.items() if e == endpoint]
        duplicates = [(*k, n) for k, n in self._duplicates.get(endpoint, {}).items()]
        return self.entries.export(endpoint), groups, duplicates

    def import_tables(
        self,
        endpoint: str,
        entries: list[tuple[str, int | None, int]],
        groups: list[tuple[int, str, int, int | None]],
        duplicates: list[tuple[str, int | None, int, int, int]],
    ) -> None:
        """Restore tables exported by ``export_tables`` (bounds still apply)."""
        for tier, group, uses in entries:
            self.entries.restore(endpoint, tier, group, uses)
        for group, kind, block_size, window in groups[:MAX_GROUPS_PER_ENDPOINT]:
            self._groups[(endpoint, group)] = _GroupInfo(kind, block_size, window)
        self._group_counts[endpoint] = min(len(groups), MAX_GROUPS_PER_ENDPOINT)
        if duplicates:
            counts = self._duplicates.setdefault(endpoint, {})
            for tier, group, rank, key, n in duplicates[:MAX_DUPLICATES_PER_ENDPOINT]:
                counts[(tier, group, rank, key)] = n

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

    def _indexable_group(self, endpoint: str, event: BlockStored) -> str | None:
        """None when the event's group is indexable, else the reason to drop the event."""
        group = event.group_idx
        if group is None:
            return None
        info = self._groups.get((endpoint, group))
        if event.kv_cache_spec_kind is not None:
            if info is None or info.kind != event.kv_cache_spec_kind:
                if info is None:
                    if self._group_counts.get(endpoint, 0) >= MAX_GROUPS_PER_ENDPOINT:
                        return "too_many_groups"
                    self._group_counts[endpoint] = self._group_counts.get(endpoint, 0) + 1
                self._groups[(endpoint, group)] = _GroupInfo(
                    event.kv_cache_spec_kind, event.block_size, event.kv_cache_spec_sliding_window
                )
            return None if event.kv_cache_spec_kind in INDEXABLE_KINDS else "non_indexable_group"
        if info is None:
            # vLLM before 0.22 tags groups without kinds; group 0 is the full-attention group.
            return None if group == 0 else "non_indexable_group"
        return None if info.kind in INDEXABLE_KINDS else "non_indexable_group"

    def _stored(self, endpoint: str, model: str, rank: int, event: BlockStored) -> int:
        """Apply one BlockStored; returns the number of canonical blocks indexed."""
        stats = self.stats
        if event.group_idx is not None:
            reason = self._indexable_group(endpoint, event)
            if reason is not None:
                stats.drop(endpoint, reason)
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
        if entry is None:
            stats.drop(endpoint, "too_many_entries")
            return 0
        scope = self._scope(endpoint, rank, event.group_idx)
        parent_key = 0
        if event.parent_block_hash:
            parent = self.index.get_request_key(EngineKey(event.parent_block_hash), scope)
            if parent is None:
                parent = self._transferred_parent(endpoint, event, entry, scope)
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

        engine_block, uneven = divmod(n_tokens, n_hashes) if n_hashes else (0, 1)
        if uneven:
            # The decoder drops these too (stored_problem): an engine key must cover whole token
            # spans, else these blocks could be indexed but never removed.
            stats.drop(endpoint, "tokens_not_divisible")
            return 0
        if stats.block_sizes.get(endpoint) != engine_block:
            stats.block_sizes[endpoint] = engine_block  # the engine's own block (inflated on hybrids)
        engine_keys = event.block_hashes
        if engine_block < block:
            # Map only engine blocks whose tokens lie inside full canonical blocks.
            engine_keys = engine_keys[: len(keys) * block // engine_block]
        replacing = self._replacing.get(entry)
        if replacing is None:
            replacing = self._superseded(entry)
        duplicates = self.index.add(engine_keys, keys, [entry], scope, replacing=replacing)  # type: ignore[arg-type]
        if duplicates:
            counts = self._duplicates.setdefault(endpoint, {})
            if len(counts) >= MAX_DUPLICATES_PER_ENDPOINT:
                counts.clear()
                stats.count(endpoint, "duplicate_counts_reset")
            for engine_key in duplicates:
                dkey = (entry.tier, event.group_idx, rank, engine_key)
                counts[dkey] = counts.get(dkey, 0) + 1
        return len(keys)

    def _superseded(self, entry: PodEntry) -> tuple[PodEntry, ...]:
        """The entries a store of ``entry`` replaces on its blocks: the endpoint's speculative
        entry (the router's guess, now confirmed) unless the stored tier weighs less."""
        if len(self._replacing) > 65536:
            self._replacing.clear()
        weight = self.index.registry.weight
        speculative = PodEntry(entry.endpoint, SPECULATIVE_TIER, speculative=True, group=None)
        replacing = (speculative,) if weight(entry.tier) >= weight(SPECULATIVE_TIER) else ()
        self._replacing[entry] = replacing
        return replacing

    def _transferred_parent(
        self, endpoint: str, event: BlockStored, entry: PodEntry, scope: EngineScope
    ) -> RequestKey | None:
        """A decode engine's unknown parent that is the last block of a prompt it received (see
        ``events.transfers``): confirm that transfer on the engine and return the parent's key."""
        pending = self.transfers.pending(endpoint)
        if not pending or event.parent_block_hash is None:
            return None
        parent = EngineKey(event.parent_block_hash)
        n_hashes, n_tokens, block = len(event.block_hashes), len(event.token_ids), self.processor.block_size
        engine_block = n_tokens // n_hashes if n_hashes and n_tokens % n_hashes == 0 else 0
        span = max(1, engine_block // block)  # canonical blocks per engine block
        for transfer in reversed(pending):  # exact: the prefill engine stored that very hash
            source = self._scope(transfer.source, transfer.source_rank, event.group_idx)
            key = self.index.get_request_key(parent, source)
            if key is not None and key in transfer.keys:
                return self._confirm(endpoint, transfer, transfer.keys.index(key), span, parent, entry, scope, "exact")
        if not engine_block or engine_block % block:
            return None
        head = tokens_to_le32(event.token_ids[:engine_block])
        fits = [t for t in pending if t.engine_block == engine_block and t.n_tokens >= engine_block
                and head.startswith(t.tail)]  # fmt: skip
        if len(fits) != 1:
            return None
        transfer = fits[0]
        last = transfer.n_tokens // engine_block * span - 1
        if last >= len(transfer.keys):
            return None
        return self._confirm(endpoint, transfer, last, span, parent, entry, scope, "by_tokens")

    def _confirm(
        self, endpoint: str, transfer: Transfer, last: int, span: int, parent: EngineKey, entry: PodEntry,
        scope: EngineScope, how: str,
    ) -> RequestKey:
        """The engine holds the prompt's blocks up to ``last``: index them as its own, the parent's
        engine key mapped to the request keys of its block so later events chain without help."""
        keys = transfer.keys[: last + 1]
        mapped = keys[-span:]
        self.index.add([parent], mapped, [entry], scope)
        if len(keys) > len(mapped):
            self.index.add(None, keys[: -len(mapped)], [entry])
        self.transfers.take(endpoint, transfer)
        self.stats.count(endpoint, f"transfers_confirmed_{how}")
        return keys[-1]

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
        entry = self._entry(endpoint, event.medium, event.group_idx, new=False)
        if entry is None:  # a tier or group the endpoint never stored anything in
            stats.count(endpoint, "removes_unmapped", len(event.block_hashes))
            return
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
