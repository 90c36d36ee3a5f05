"""``p2p-source-producer``: name a peer that already caches the prompt, so the routing sidecar
pulls those KV blocks over the P2P connector instead of recomputing them.

Type        ``p2p-source-producer`` (producer and pre-request hook)
produce     among the candidates caching within one block of the most prompt tokens (CPU-tier
            blocks only when the match info has tiers: pulls are served from the source's CPU
            tier), pick one weighted by ``1 / (1 + waiting requests)``, sampled at
            ``fnv32a(request id) / 2³²`` (spreads pulls of a widely cached prefix)
pre_request set ``x-kv-cache-source-host-port: <ip:port>`` when that peer is not the computing
            endpoint (the prefill pick if ``prefillProfileName`` ran, else the primary pick) and
            caches at least ``minCachedTokenDelta`` tokens more than it; an inbound value is dropped
Consumes    ``PrefixCacheMatchInfoDataKey/<prefixMatchInfoProducerName>``
Parameters  ``prefixMatchInfoProducerName`` [""; empty reads approx-prefix-cache-producer],
            ``minCachedTokenDelta`` [1; ≥ 1], ``prefillProfileName`` [prefill]

    plugins:
    - type: precise-prefix-cache-producer
    - type: p2p-source-producer
      parameters: {prefixMatchInfoProducerName: precise-prefix-cache-producer, minCachedTokenDelta: 1}

Follows ``llm-d/llm-d-router: pkg/epp/framework/plugins/requestcontrol/dataproducer/p2psource/``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ppc_extproc.enginemetrics import EngineMetricsStore
from ppc_extproc.errors import ConfigError
from ppc_extproc.framework import (
    PREFIX_CACHE_MATCH_INFO,
    Consumes,
    DataKey,
    DataProducer,
    DataType,
    Endpoint,
    PreRequest,
    SchedulingContext,
    SchedulingResult,
)
from ppc_extproc.framework.params import Section, decode, param
from ppc_extproc.ids import EndpointId, destination_host_port
from ppc_extproc.matchinfo import PrefixCacheMatchInfo
from ppc_extproc.plugins.registry import Services, register

__all__ = ["KV_CACHE_SOURCE_HEADER", "P2PSourceProducer", "fnv32a"]

KV_CACHE_SOURCE_HEADER = "x-kv-cache-source-host-port"
_BEST: DataType[tuple[EndpointId, int]] = DataType("best-match")


def fnv32a(data: bytes) -> int:
    """32-bit FNV-1a (Go's ``hash/fnv.New32a``)."""
    h = 0x811C9DC5
    for byte in data:
        h = ((h ^ byte) * 0x01000193) & 0xFFFFFFFF
    return h


@dataclass(frozen=True, slots=True)
class P2PSourceConfig:
    producer_name: str = param("prefixMatchInfoProducerName", "")
    min_cached_token_delta: int = param("minCachedTokenDelta", 1)
    prefill_profile: str = param("prefillProfileName", "prefill")


@register("p2p-source-producer")
class P2PSourceProducer(DataProducer, PreRequest):
    def __init__(self, name: str = "p2p-source-producer", config: P2PSourceConfig | None = None,
                 metrics: EngineMetricsStore | None = None) -> None:  # fmt: skip
        self.name = name
        self.config = config or P2PSourceConfig()
        self.reads = self.config.producer_name or "approx-prefix-cache-producer"
        self.match_key = PREFIX_CACHE_MATCH_INFO.of(self.reads)
        self.metrics = metrics
        self.best_key = _BEST.of(name)

    @classmethod
    def from_parameters(cls, name: str, params: Section, services: Services) -> P2PSourceProducer:
        config = decode(params, P2PSourceConfig)
        if config.min_cached_token_delta < 1:
            raise ConfigError(params.child_path("minCachedTokenDelta"),
                              f"p2p-source-producer: minCachedTokenDelta must be >= 1, got {config.min_cached_token_delta}")  # fmt: skip
        return cls(name, P2PSourceConfig(config.producer_name, config.min_cached_token_delta,
                                         config.prefill_profile or "prefill"), services.engine_metrics)  # fmt: skip

    def consumes(self) -> tuple[Consumes[object], ...]:
        return (Consumes(PREFIX_CACHE_MATCH_INFO, self.reads),)

    def produces(self) -> frozenset[DataKey[object]]:
        return frozenset({self.best_key})

    def _info(self, ctx: SchedulingContext, endpoint: EndpointId) -> PrefixCacheMatchInfo | None:
        return ctx.endpoint_value(endpoint, self.match_key)

    def _waiting(self, endpoint: Endpoint) -> int:
        snapshot = self.metrics.snapshot(endpoint.id) if self.metrics is not None else None
        return snapshot.waiting or 0 if snapshot is not None else 0

    def produce(self, ctx: SchedulingContext) -> None:
        matches: list[tuple[Endpoint, int, int]] = []
        most = 0
        for endpoint in ctx.candidates:
            info = self._info(ctx, endpoint.id)
            if info is None:
                continue
            blocks = info.cached_blocks_by_tier.get("cpu", 0) if info.cached_blocks_by_tier else info.cached_block_count
            cached = blocks * info.block_size_tokens
            if cached:
                matches.append((endpoint, cached, info.block_size_tokens))
                most = max(most, cached)
        band = [(e, cached, 1.0 / (1 + self._waiting(e))) for e, cached, block in matches if cached + block >= most]
        if not band:
            return
        target = fnv32a(ctx.request.request_id.encode()) / 2**32 * sum(w for _, _, w in band)
        chosen = band[-1]
        for entry in band:
            if target < entry[2]:
                chosen = entry
                break
            target -= entry[2]
        ctx.put(self.best_key, (chosen[0].id, chosen[1]))

    def pre_request(self, ctx: SchedulingContext, result: SchedulingResult) -> None:
        if KV_CACHE_SOURCE_HEADER not in result.remove_headers:
            result.remove_headers.append(KV_CACHE_SOURCE_HEADER)
        best = ctx.get(self.best_key)
        if best is None:
            return
        computing = result.profile_results.get(self.config.prefill_profile)
        if computing is None or not computing.targets:
            computing = result.profile_results.get(result.primary_profile)
        if computing is None or not computing.targets:
            return
        target = computing.targets[0].id
        info = self._info(ctx, target)
        computing_cached = info.cached_block_count * info.block_size_tokens if info is not None else 0
        source, cached = best
        if source != target and cached - computing_cached >= self.config.min_cached_token_delta:
            result.add_header(KV_CACHE_SOURCE_HEADER, destination_host_port(source))
