"""``mm-embeddings-cache-producer``: which endpoints recently encoded this request's images, audio, video.

Type        ``mm-embeddings-cache-producer`` (producer, with ``pre_request`` and ``extract``; llm-d's
            default producer of its key: created when a scorer reads it and none is configured)
produce     the request's multimodal item hashes (``TokenizedPrompt`` features: a token-id body's
            ``mm_hashes``, or a render backend's), each counted once ⇒ per candidate
            ``EncoderCacheMatchInfo(matched, total)`` under
            ``MultiModalEncoderCacheMatchInfoKey/<name>``: how many of them that endpoint's LRU holds
pre_request the primary profile's targets now hold every item (not on dry runs)
extract     a deleted endpoint's LRU is dropped
Consumes    ``TokenizedPrompt`` (exact or estimated ids; only the features matter)

Parameters (llm-d's names and defaults)
    cacheSizeInMBPerServer  4096   per-endpoint budget in MiB of the engine's encoder cache;
                                   entries remembered per endpoint = MiB / 2 (llm-d assumes 2 MiB
                                   per item); ≤ 0 ⇒ the default; at most 1 Mi entries
    cacheSizeInMB           —      the key before llm-d renamed it (llm-d-router #1385, still in
                                   its sample ``epp-mm-embeddings-cache-config.yaml``); llm-d's strict
                                   decoder rejects it. Accepted as ``cacheSizeInMBPerServer`` with a
                                   warning naming that key (ignored when both are set)

    plugins:
    - type: mm-embeddings-cache-producer
      parameters: {cacheSizeInMBPerServer: 2048}
    - type: mm-embeddings-cache-scorer

Follows ``llm-d/llm-d-router: pkg/epp/framework/plugins/requestcontrol/dataproducer/multimodal/``
(``producer.go``, ``prerequest.go``). Differences: placements are recorded synchronously (llm-d
does it on a goroutine); llm-d's two-minute sweep of pods missing from the pod list is covered by
the endpoint pool's delete events, which every producer receives; the ``encoder_cache_*``
metrics are not exported.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from ppc_extproc.framework import (
    TOKENIZED_PROMPT,
    Consumes,
    DataKey,
    DataProducer,
    DataType,
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
from ppc_extproc.plugins.registry import Services, register

__all__ = [
    "MM_EMBEDDINGS_CACHE_PRODUCER",
    "MM_ENCODER_CACHE_MATCH_INFO",
    "EncoderCacheMatchInfo",
    "MMEmbeddingsCacheProducer",
    "lru_capacity",
]

MM_EMBEDDINGS_CACHE_PRODUCER = "mm-embeddings-cache-producer"
DEFAULT_CACHE_SIZE_MB = 4096
#: llm-d's fixed assumption of one encoder output's size (``bytesPerImage``).
MB_PER_ITEM = 2
MAX_ENTRIES_PER_ENDPOINT = 1 << 20


@dataclass(frozen=True, slots=True)
class EncoderCacheMatchInfo:
    """One endpoint's share of a request's multimodal items (every item weighs 1, as in llm-d)."""

    matched_items: int
    request_items: int


#: Per endpoint (``SchedulingContext.endpoint_value``).
MM_ENCODER_CACHE_MATCH_INFO: DataType[EncoderCacheMatchInfo] = DataType("MultiModalEncoderCacheMatchInfoKey")
#: Per request, under the producer's name, for ``pre_request``: the request's unique item hashes.
_ITEMS: DataType[tuple[str, ...]] = DataType("MultiModalEncoderCacheItems")


def lru_capacity(cache_size_mb: int) -> int:
    """Entries remembered per endpoint for a MiB budget (≤ 0 ⇒ the default budget)."""
    mb = cache_size_mb if cache_size_mb > 0 else DEFAULT_CACHE_SIZE_MB
    return max(1, min(MAX_ENTRIES_PER_ENDPOINT, mb // MB_PER_ITEM))


@register(MM_EMBEDDINGS_CACHE_PRODUCER)
class MMEmbeddingsCacheProducer(DataProducer, PreRequest, EndpointExtractor, StateReporter):
    """Writes ``MultiModalEncoderCacheMatchInfoKey/<name>`` for every candidate of a multimodal request."""

    def __init__(self, name: str = MM_EMBEDDINGS_CACHE_PRODUCER, capacity: int = lru_capacity(0)) -> None:
        self.name = name
        self.capacity = capacity
        self.match_key = MM_ENCODER_CACHE_MATCH_INFO.of(name)
        self._items_key = _ITEMS.of(name)
        self._caches: dict[EndpointId, OrderedDict[str, None]] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_parameters(cls, name: str, params: Section, services: Services) -> MMEmbeddingsCacheProducer:
        size = params.integer("cacheSizeInMBPerServer", 0)
        if params.has("cacheSizeInMB"):
            legacy = params.integer("cacheSizeInMB", 0)
            if params.has("cacheSizeInMBPerServer"):
                params.warn("cacheSizeInMB", "is not a parameter of mm-embeddings-cache-producer and is ignored: "
                                             "cacheSizeInMBPerServer is set")  # fmt: skip
            else:
                params.warn("cacheSizeInMB", f"is not a parameter of mm-embeddings-cache-producer (llm-d renamed it "
                                             f"and its strict decoder rejects it); write cacheSizeInMBPerServer: "
                                             f"{legacy} (taken as that)")  # fmt: skip
                size = legacy
        return cls(name, lru_capacity(size))

    def produces(self) -> frozenset[DataKey[object]]:
        return frozenset({self.match_key})

    def consumes(self) -> tuple[Consumes[object], ...]:
        return (Consumes(TOKENIZED_PROMPT),)

    @staticmethod
    def request_items(ctx: SchedulingContext) -> tuple[str, ...]:
        """The request's multimodal item hashes, each once, in prompt order."""
        tokenized = ctx.request.tokenized
        if tokenized is None:
            return ()
        return tuple(dict.fromkeys(f.hash for f in tokenized.features if f.hash))

    def produce(self, ctx: SchedulingContext) -> None:
        """Match info for every candidate; nothing for a request without multimodal items."""
        items = self.request_items(ctx)
        if not items:
            return
        ctx.put(self._items_key, items)
        with self._lock:
            matched = {
                e.id: sum(1 for h in items if h in cache) if (cache := self._caches.get(e.id)) is not None else 0
                for e in ctx.candidates
            }
        for endpoint_id, n in matched.items():
            ctx.put_endpoint_value(endpoint_id, self.match_key, EncoderCacheMatchInfo(n, len(items)))

    def pre_request(self, ctx: SchedulingContext, result: SchedulingResult) -> None:
        """The primary profile's targets now hold this request's items (most recent)."""
        items = ctx.get(self._items_key)
        if not items:
            return
        targets = result.primary.targets or result.targets
        self.record([e.id for e in targets], items)

    def record(self, endpoints: Sequence[EndpointId], items: Sequence[str]) -> None:
        """Remember ``items`` as the most recent entries of each endpoint's LRU."""
        with self._lock:
            for endpoint_id in endpoints:
                cache = self._caches.get(endpoint_id)
                if cache is None:
                    cache = self._caches[endpoint_id] = OrderedDict()
                for item in items:
                    cache[item] = None
                    cache.move_to_end(item)
                while len(cache) > self.capacity:
                    cache.popitem(last=False)

    def extract(self, event: EndpointEvent) -> None:
        """Forget a deleted endpoint (or the old id of a moved one)."""
        gone = event.endpoint.id if event.kind is EndpointEventKind.DELETED else None
        if event.previous is not None and event.previous.id != event.endpoint.id:
            gone = event.previous.id
        if gone is not None:
            with self._lock:
                self._caches.pop(gone, None)

    def items_per_endpoint(self) -> dict[str, int]:
        """Items remembered per endpoint (never the hashes)."""
        with self._lock:
            return {ep: len(cache) for ep, cache in self._caches.items()}

    def state(self, *, detailed: bool = False) -> PluginState:
        return PluginState(self.name, self.type_name,
                           details={"capacityPerEndpoint": self.capacity, "itemsPerEndpoint": self.items_per_endpoint()})  # fmt: skip
