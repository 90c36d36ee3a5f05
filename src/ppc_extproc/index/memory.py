"""The in-memory dual-key KV-block index (llm-d's ``kvblock.Index``, in-memory backend).

Two maps, both bounded with approximate LRU eviction:

* request key → entry mask: which (endpoint, tier, speculative, group) entries hold the block;
* scoped engine key → request key(s): resolves ``parent_block_hash`` and ``BlockRemoved``.

Engine keys are scoped per ``(endpoint, dp_rank, group)`` by XOR with a 64-bit hash of the scope,
so two pods reporting the same engine hash never overwrite each other's mapping (llm-d keeps them
global: ``llm-d/llm-d-router: pkg/kvcache/kvblock/in_memory.go``). Thread-safe: the KV-event thread
writes while the request path reads.
"""

from __future__ import annotations

import itertools
import threading
from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import xxhash

from ppc_extproc.ids import MASK64, EndpointId, EngineKey, RequestKey
from ppc_extproc.index import recency
from ppc_extproc.index.entries import EntryRegistry, MaskInfo, PodEntry
from ppc_extproc.index.lru import TwoGenerationLRU
from ppc_extproc.index.mapping import engine_to_request_mapping

__all__ = ["DEFAULT_INDEX_SIZE", "EngineScope", "InMemoryIndex", "IndexBlocks", "IndexSnapshot", "IndexStats", "PrefixRun"]

#: Default bound on request keys (and on engine mappings). llm-d's default is 1e8, which in a
#: Python process would mean ~15 GB before anything is evicted.
DEFAULT_INDEX_SIZE = 10_000_000


@dataclass(frozen=True, slots=True)
class EngineScope:
    """What an engine hash is unique within: one endpoint's DP rank and KV-cache group."""

    endpoint: EndpointId
    dp_rank: int = 0
    group: int | None = None


@dataclass(frozen=True, slots=True)
class PrefixRun:
    """``count`` consecutive blocks of a request that share the same (filtered) entries."""

    info: MaskInfo
    count: int


@dataclass(frozen=True, slots=True)
class IndexSnapshot:
    """The index's contents by value: request key → its entries, scoped engine key → request
    key(s), and every entry that owns a bit."""

    request_keys: dict[int, frozenset[str]]
    engine_keys: dict[int, int | tuple[int, ...]]
    entries: frozenset[str]


@dataclass(frozen=True, slots=True)
class IndexBlocks:
    """The index's non-speculative contents, compact: ``entries``; distinct entry sets as
    positions in ``entries``; request keys with the position of their set; scoped engine keys
    with their request key (``engine_multi``: those mapping to several)."""

    entries: list[PodEntry]
    masks: list[list[int]]
    request_keys: Sequence[int]
    mask_ids: Sequence[int]
    engine_keys: Sequence[int]
    engine_values: Sequence[int]
    engine_multi: list[tuple[int, list[int]]]


@dataclass(frozen=True, slots=True)
class IndexStats:
    request_keys: int
    engine_keys: int
    entries: int
    evicted_request_keys: int
    evicted_engine_keys: int


class InMemoryIndex:
    """Request-key → entries index with an engine-key → request-key mapping."""

    def __init__(
        self,
        size: int = DEFAULT_INDEX_SIZE,
        pod_cache_size: int = 10,
        tier_weights: Mapping[str, float] | None = None,
    ) -> None:
        if pod_cache_size < 1:
            raise ValueError("podCacheSize must be at least 1")
        self.size = size
        self.pod_cache_size = pod_cache_size
        self.registry = EntryRegistry(tier_weights)
        self._keys: TwoGenerationLRU[int, int] = TwoGenerationLRU(size)
        self._engine: TwoGenerationLRU[int, int | tuple[int, ...]] = TwoGenerationLRU(size)
        self._scope_salts: dict[EngineScope, int] = {}
        self._lock = threading.Lock()

    # --- writes --------------------------------------------------------------------------------

    def add(
        self,
        engine_keys: Sequence[EngineKey] | None,
        request_keys: Sequence[RequestKey],
        entries: Sequence[PodEntry],
        scope: EngineScope | None = None,
        *,
        replacing: Sequence[PodEntry] = (),
    ) -> list[EngineKey]:
        """Map engine keys to request keys (proportionally), then add ``entries`` to every request
        key. ``engine_keys=None`` is the speculative / tier-update form. ``replacing``: entries
        removed from every request key in the same write (a confirmed entry superseding the
        endpoint's speculative one).

        Returns the engine keys that were already mapped to request keys holding all ``entries``:
        a second store of the same block, which the caller reference-counts."""
        if not request_keys:
            raise ValueError("add needs at least one request key")
        if not entries:
            raise ValueError("add needs at least one entry")
        duplicates: list[EngineKey] = []
        with self._lock:
            bit = self.registry.bit
            adding = (bit(entries[0]),) if len(entries) == 1 else tuple(bit(entry) for entry in entries)
            bits = 1 << adding[0] if len(adding) == 1 else self.registry.mask(entries)
            if engine_keys:
                salt = self._salt(scope or EngineScope(entries[0].endpoint))
                if len(engine_keys) == len(request_keys):  # the common 1:1 case, without tuples
                    mapped_engine_keys: Sequence[int] = engine_keys
                    values: Sequence[int | tuple[int, ...]] = request_keys
                else:
                    pairs = list(engine_to_request_mapping(engine_keys, request_keys))
                    mapped_engine_keys = [e for e, _ in pairs]
                    values = [r[0] if len(r) == 1 else r for _, r in pairs]
                previous = self._engine.set_many(mapped_engine_keys, values, salt)
                if previous.count(None) != len(previous):
                    peek = self._keys.peek
                    for engine_key, before in zip(mapped_engine_keys, previous):
                        if before is not None:
                            held = peek(before if isinstance(before, int) else before[0])
                            if held is not None and held & bits == bits:
                                duplicates.append(EngineKey(engine_key))
            if not isinstance(request_keys, list):
                request_keys = list(request_keys)
            limit = self.pod_cache_size
            drop = self.registry.known_mask(replacing) if replacing else 0
            if drop:
                keep = ~drop
                self._keys.or_bits(
                    request_keys, lambda mask: recency.add(recency.restrict(mask, keep) if mask else mask, adding, limit)
                )
            else:
                self._keys.or_bits(request_keys, lambda mask: recency.add(mask, adding, limit))
        return duplicates

    def evict_engine_key(
        self, engine_key: EngineKey, scope: EngineScope, entries: Sequence[PodEntry]
    ) -> bool:
        """Remove ``entries`` from the request keys an engine key maps to. The mapping is dropped
        only when none of its request keys holds any entry any more. False if unmapped."""
        if not entries:
            raise ValueError("evict needs at least one entry")
        with self._lock:
            scoped = (engine_key ^ self._salt(scope)) & MASK64
            mapped = self._engine.peek(scoped)
            if mapped is None:
                return False
            request_keys = (mapped,) if isinstance(mapped, int) else mapped
            bits = self.registry.known_mask(entries)
            remaining = False
            for key in request_keys:
                remaining |= self._remove_bits(key, bits)
            if not remaining:
                self._engine.pop(scoped)
            return True

    def evict_request_keys(
        self, request_keys: Iterable[RequestKey], entries: Sequence[PodEntry]
    ) -> None:
        """Remove ``entries`` from request keys directly (speculative expiry)."""
        with self._lock:
            bits = self.registry.known_mask(entries)
            if bits:
                keys = request_keys if isinstance(request_keys, (list, tuple)) else list(request_keys)
                self._keys.and_not_bits(keys, bits)

    def clear(self, endpoint: str) -> int:
        """Remove every entry of ``endpoint`` (all tiers, groups, speculative). Engine mappings stay
        and self-heal through LRU. Returns the number of request keys that lost an entry."""
        with self._lock:
            return self._clear_bits(self.registry.endpoint_mask(endpoint))

    def forget_endpoint(self, endpoint: str) -> int:
        """``clear`` and recycle the endpoint's entry bits (endpoint deleted from the pool)."""
        with self._lock:
            touched = self._clear_bits(self.registry.endpoint_mask(endpoint))
            self.registry.release_endpoint(endpoint)
            return touched

    def release_entry(self, entry: PodEntry) -> int:
        """Remove one entry from every request key and recycle its bit (an endpoint's least used
        tier or group making room). Returns the number of request keys that lost it."""
        with self._lock:
            bit = self.registry.known_mask([entry])
            touched = self._clear_bits(bit)
            self.registry.release(entry)
            return touched

    # --- reads ---------------------------------------------------------------------------------

    def get_request_key(self, engine_key: EngineKey, scope: EngineScope) -> RequestKey | None:
        """The last request key mapped to an engine key (the parent of a chained event)."""
        with self._lock:
            mapped = self._engine.get((engine_key ^ self._salt(scope)) & MASK64)
        if mapped is None:
            return None
        return RequestKey(mapped if isinstance(mapped, int) else mapped[-1])

    def lookup(
        self, request_keys: Sequence[RequestKey], endpoints: Iterable[str] | None = None
    ) -> dict[RequestKey, list[PodEntry]]:
        """llm-d's ``Lookup``: entries per key, filtered to ``endpoints`` (None or empty = all).
        Absent keys are skipped; keys with no entry left after filtering are omitted."""
        if not request_keys:
            raise ValueError("lookup needs at least one request key")
        with self._lock:
            wanted = set(endpoints or ())
            filt = self.registry.endpoints_mask(wanted) if wanted else -1
            found: dict[RequestKey, list[PodEntry]] = {}
            for key in request_keys:
                mask = self._keys.get(key)
                if mask is None:
                    continue
                mask &= filt
                if mask:
                    found[key] = self.registry.entries(mask)
            return found

    def prefix_runs(
        self, request_keys: Sequence[RequestKey], endpoints: Iterable[str] | None = None
    ) -> list[PrefixRun]:
        """The consecutive prefix of ``request_keys`` held by endpoints that also hold every earlier
        block, as runs of blocks with identical entries. Stops when no candidate endpoint can
        extend its prefix — everything a longest-prefix scorer needs, under one lock acquisition.
        ``endpoints`` None means every endpoint."""
        runs: list[PrefixRun] = []
        if not request_keys:
            return runs
        with self._lock:
            registry = self.registry
            filt = registry.endpoints_mask(endpoints) if endpoints is not None else -1
            current = 0
            count = 0
            # Equal raw masks stay equal under the narrowed filter (it keeps whole endpoints of
            # the mask), so the walk goes run by run.
            for raw, n in self._keys.get_prefix_runs(request_keys):
                mask = raw & filt
                if not mask:
                    break
                if mask == current:
                    count += n
                    continue
                if count:
                    runs.append(PrefixRun(registry.info(current), count))
                # An endpoint missing here can never extend its prefix again: narrow the filter.
                filt &= registry.info(mask).endpoints_mask
                current, count = mask, n
            if count:
                runs.append(PrefixRun(registry.info(current), count))
        return runs

    def entries_per_endpoint(self) -> dict[str, int]:
        """Number of request keys each endpoint holds an entry for (a debug view; O(keys))."""
        with self._lock:
            counts: dict[int, int] = {}
            for mask in self._keys.values():
                counts[mask] = counts.get(mask, 0) + 1
            per_endpoint: dict[str, int] = {}
            for mask, n in counts.items():
                for endpoint in {e.endpoint for e in self.registry.entries(mask)}:
                    per_endpoint[endpoint] = per_endpoint.get(endpoint, 0) + n
            return per_endpoint

    def snapshot(self) -> IndexSnapshot:
        """Everything the index holds, by value (for tests and debugging; O(keys))."""
        with self._lock:
            entries = self.registry.entries
            return IndexSnapshot(
                request_keys={k: frozenset(map(str, entries(mask))) for k, mask in self._keys.items()},
                engine_keys=dict(self._engine.items()),
                entries=frozenset(map(str, self.registry.known())),
            )

    def export_blocks(self) -> IndexBlocks:
        """The non-speculative contents in a compact form for a warm-restart snapshot, oldest
        first. The lock is held only to copy the two maps (C-level list copies); the O(keys)
        encoding runs after, so the request path waits milliseconds, not the whole export."""
        with self._lock:
            entries = [e for e in self.registry.known() if not e.speculative]
            position = {self.registry.bit(e): i for i, e in enumerate(entries)}
            keep = ~sum(1 << self.registry.bit(e) for e in self.registry.known() if e.speculative)
            key_maps = self._keys.copy_items()
            engine_maps = self._engine.copy_items()
        masks: dict[int, int] = {}
        keys = array("Q")
        ids = array("I")
        for key, mask in itertools.chain.from_iterable(m.items() for m in key_maps):
            mask &= keep
            if not mask:
                continue
            mask_id = masks.get(mask)
            if mask_id is None:
                mask_id = masks[mask] = len(masks)
            keys.append(key)
            ids.append(mask_id)
        del key_maps
        engine_keys = array("Q")
        engine_values = array("Q")
        multi: list[tuple[int, list[int]]] = []
        for engine_key, value in itertools.chain.from_iterable(m.items() for m in engine_maps):
            if isinstance(value, int):
                engine_keys.append(engine_key)
                engine_values.append(value)
            else:
                multi.append((engine_key, list(value)))
        mask_lists = []
        for mask in masks:
            members = []
            while mask:
                low = mask & -mask
                members.append(position[low.bit_length() - 1])
                mask ^= low
            mask_lists.append(members)
        return IndexBlocks(entries, mask_lists, keys, ids, engine_keys, engine_values, multi)

    def import_blocks(self, blocks: IndexBlocks) -> None:
        """Add an ``export_blocks`` result (a snapshot being loaded) to this index."""
        with self._lock:
            bits = [1 << self.registry.bit(e) for e in blocks.entries]
            masks = [sum(bits[i] for i in set(members)) for members in blocks.masks]
            self._keys.update_many(blocks.request_keys, [masks[i] for i in blocks.mask_ids])
            self._engine.update_many(blocks.engine_keys, blocks.engine_values)
            if blocks.engine_multi:
                self._engine.update_many(
                    [k for k, _ in blocks.engine_multi], [tuple(v) for _, v in blocks.engine_multi]
                )

    def stats(self) -> IndexStats:
        with self._lock:
            return IndexStats(
                request_keys=len(self._keys),
                engine_keys=len(self._engine),
                entries=len(self.registry),
                evicted_request_keys=self._keys.evicted,
                evicted_engine_keys=self._engine.evicted,
            )

    def __len__(self) -> int:
        return len(self._keys)

    # --- internals (lock held) -----------------------------------------------------------------

    def _salt(self, scope: EngineScope) -> int:
        salt = self._scope_salts.get(scope)
        if salt is None:
            if len(self._scope_salts) > 65536:
                self._scope_salts.clear()
            salt = xxhash.xxh64_intdigest(f"{scope.endpoint}|{scope.dp_rank}|{scope.group}".encode())
            self._scope_salts[scope] = salt
        return salt

    def _remove_bits(self, key: int, bits: int) -> bool:
        """Clear ``bits`` on one key; drop the key when empty. True if the key still holds entries."""
        mask = self._keys.peek(key)
        if mask is None:
            return False
        if not mask & bits:
            return True
        new = recency.restrict(mask, ~bits)
        if new:
            self._keys.replace(key, new)
            return True
        self._keys.pop(key)
        return False

    def _clear_bits(self, bits: int) -> int:
        if not bits:
            return 0
        touched = 0
        for key, mask in self._keys.items():
            if mask & bits:
                self._remove_bits(key, bits)
                touched += 1
        return touched
