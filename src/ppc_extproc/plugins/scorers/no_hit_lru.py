"""``no-hit-lru-scorer``: spread cold requests (no prefix hit anywhere) over the endpoints.

Type        ``no-hit-lru-scorer`` (scorer, with a ``pre_request`` hook)
Formula     warm request (some candidate has ``matchBlocks > 0``) ⇒ 0.5 for every candidate.
            Cold request (no match info, or all 0), N = #candidates: N = 1 ⇒ 1.0; never-used
            candidates (not in the LRU), in a random order i = 0, 1, … ⇒ ``1 − i / (N − 1)``
            (llm-d ranks them in candidate order, which its datastore lists from a ``sync.Map``:
            random too; in a fixed order every replica would send its first cold requests to
            the same endpoints);
            used ones ⇒ ``rank = #never_used + lru_pos`` (lru_pos 0 = least recently used, over all
            LRU keys) ⇒ ``max(0, 1 − rank / (N − 1))``.
            After a cold request is routed, its primary target becomes the most recently used.
Inputs      ``PrefixCacheMatchInfoDataKey/<producer>``
Parameters  ``lruSize`` (default 1024, ≥ 1) — endpoints remembered
            ``prefixMatchInfoProducerName`` (default "" ⇒ the approximate producer, as in llm-d;
            the loader warns when a precise producer is configured but not named)
            ``prefixPluginType``, ``prefixPluginName``: deprecated upstream, accepted and ignored

    plugins:
    - type: no-hit-lru-scorer
      parameters: {lruSize: 1024, prefixMatchInfoProducerName: precise-prefix-cache-producer}
"""

from __future__ import annotations

import random
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from ppc_extproc.framework import (
    PREFIX_CACHE_MATCH_INFO,
    Consumes,
    DataConsumer,
    DataType,
    Endpoint,
    PreRequest,
    SchedulingContext,
    SchedulingResult,
    Scorer,
)
from ppc_extproc.framework.params import Section, decode, param
from ppc_extproc.ids import EndpointId
from ppc_extproc.plugins.registry import Services, register
from ppc_extproc.plugins.scorers.prefix_cache import APPROXIMATE_PRODUCER

__all__ = ["NoHitLRUConfig", "NoHitLRUScorer"]


@dataclass(frozen=True, slots=True)
class NoHitLRUConfig:
    """The scorer's parameters (llm-d's ``prefixPluginType``/``Name`` are accepted, unused)."""

    prefix_plugin_type: str = param("prefixPluginType", "")
    prefix_plugin_name: str = param("prefixPluginName", "")
    lru_size: int = param("lruSize", 1024, minimum=1)
    producer_name: str = param("prefixMatchInfoProducerName", "")

#: Per request, under the scorer's name: no candidate had a cached prefix (for ``pre_request``).
_COLD: DataType[bool] = DataType("NoHitLRUCold")


@register("no-hit-lru-scorer")
class NoHitLRUScorer(Scorer, DataConsumer, PreRequest):
    def __init__(
        self,
        name: str = "no-hit-lru-scorer",
        lru_size: int = 1024,
        producer_name: str = "",
        rng: random.Random | None = None,
    ) -> None:
        self.name = name
        self.lru_size = lru_size
        self.producer_name = producer_name
        self.match_key = PREFIX_CACHE_MATCH_INFO.of(self.reads)
        self._cold_key = _COLD.of(name)
        #: endpoint id → None, least recently used first.
        self._lru: OrderedDict[EndpointId, None] = OrderedDict()
        self._lock = threading.Lock()
        #: Orders the never-used candidates.
        self._rng = rng or random.Random()

    @classmethod
    def from_parameters(cls, name: str, params: Section, services: Services) -> NoHitLRUScorer:
        config = decode(params, NoHitLRUConfig)
        return cls(name, config.lru_size, config.producer_name)

    @property
    def reads(self) -> str:
        """The producer whose match info this scorer reads."""
        return self.producer_name or APPROXIMATE_PRODUCER

    def consumes(self) -> tuple[Consumes[object], ...]:
        return (Consumes(PREFIX_CACHE_MATCH_INFO, self.reads),)

    def is_cold(self, ctx: SchedulingContext, endpoints: Sequence[Endpoint]) -> bool:
        info_of = ctx.endpoint_values(self.match_key).get
        for endpoint in endpoints:
            info = info_of(endpoint.id)
            if info is not None and info.match_blocks > 0:
                return False
        return True

    def score(self, ctx: SchedulingContext, endpoints: Sequence[Endpoint]) -> dict[EndpointId, float]:
        cold = self.is_cold(ctx, endpoints)
        ctx.put(self._cold_key, cold)
        if not cold:
            return {e.id: 0.5 for e in endpoints}
        n = len(endpoints)
        if n == 1:
            return {endpoints[0].id: 1.0}
        with self._lock:
            positions = {ep: i for i, ep in enumerate(self._lru)}
            never_used = [e.id for e in endpoints if e.id not in positions]
            self._rng.shuffle(never_used)
        scores = {ep: 1.0 - i / (n - 1) for i, ep in enumerate(never_used)}
        for endpoint in endpoints:
            pos = positions.get(endpoint.id)
            if pos is not None:
                scores[endpoint.id] = max(0.0, 1.0 - (len(never_used) + pos) / (n - 1))
        return scores

    def pre_request(self, ctx: SchedulingContext, result: SchedulingResult) -> None:
        """A cold request was routed: its primary target becomes the most recently used."""
        cold = ctx.pop(self._cold_key)
        if not cold or not result.targets:
            return
        primary = result.targets[0].id
        with self._lock:
            self._lru[primary] = None
            self._lru.move_to_end(primary)
            while len(self._lru) > self.lru_size:
                self._lru.popitem(last=False)

    def lru_order(self) -> list[EndpointId]:
        """Endpoints, least recently used first (debugging, tests)."""
        with self._lock:
            return list(self._lru)
