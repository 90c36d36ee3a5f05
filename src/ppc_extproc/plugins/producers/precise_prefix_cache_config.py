"""Parameters of ``precise-prefix-cache-producer``, decoded strictly with llm-d's names and defaults.

Unknown keys are errors naming the key and the plugin; every error carries the field's path.
Follows ``llm-d/llm-d-router: pkg/epp/framework/plugins/requestcontrol/dataproducer/preciseprefixcache/``
and the indexer configuration in ``pkg/kvcache/``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ppc_extproc.blockkeys import TokenProcessorConfig
from ppc_extproc.blockkeys.config import HASH_ALGORITHMS
from ppc_extproc.errors import ConfigError
from ppc_extproc.events.config import (
    ENGINE_TYPES,
    MAX_BATCH_WINDOW_SECONDS,
    CurveConfig,
    KVEventsConfig,
    PodDiscoveryConfig,
)
from ppc_extproc.framework.params import Section
from ppc_extproc.index.config import IndexerConfig
from ppc_extproc.index.entries import DEFAULT_TIER_WEIGHTS
from ppc_extproc.index.memory import DEFAULT_INDEX_SIZE

__all__ = ["PrecisePrefixCacheProducerConfig", "WarmRestartConfig", "parse_producer_config"]

_OWNER = "precise-prefix-cache-producer"


@dataclass(frozen=True, slots=True)
class WarmRestartConfig:
    """``warmRestart``: snapshot the index to ``stateDir`` and load it on start ("" = off)."""

    state_dir: str = ""
    #: Seconds between periodic snapshots (``snapshotInterval``; 0 = only on shutdown).
    interval_seconds: float = 60.0
    #: Largest snapshot written or read (``maxSnapshotBytes``).
    max_bytes: int = 2 << 30
    #: Restored parts whose endpoint is not back in the pool by then are dropped (``restoreTTL``).
    restore_ttl_seconds: float = 300.0


@dataclass(frozen=True, slots=True)
class PrecisePrefixCacheProducerConfig:
    token_processor: TokenProcessorConfig = field(default_factory=TokenProcessorConfig)
    indexer: IndexerConfig = field(default_factory=IndexerConfig)
    kv_events: KVEventsConfig = field(default_factory=KVEventsConfig)
    #: Seed speculative entries for the picked endpoint (llm-d default false; every guide sets true).
    speculative_indexing: bool = False
    #: Lifetime of speculative entries in seconds (``speculativeTTL``, Go duration, default "2s").
    speculative_ttl_seconds: float = 2.0
    #: ppc-extproc's: under P/D, credit the decode engine with the prompt it receives
    #: (``creditDecodeEngine``, default true; false is llm-d's behaviour).
    credit_decode_engine: bool = True
    #: How long an unconfirmed decode-engine credit and its pending transfer last
    #: (``decodeCreditTTL``, Go duration, default "120s").
    decode_credit_ttl_seconds: float = 120.0
    warm_restart: WarmRestartConfig = field(default_factory=WarmRestartConfig)


def _token_processor(s: Section) -> TokenProcessorConfig:
    size = s.integer("blockSizeTokens", 0)
    deprecated = s.integer("blockSize", 0)
    if size == 0:
        size = deprecated if deprecated > 0 else 16
    if size <= 0:
        raise ConfigError(s.child_path("blockSizeTokens"), f"blockSizeTokens must be greater than 0, got {size}")
    algorithm = s.string("hashAlgorithm", "xxh64", choices=HASH_ALGORITHMS)
    config = TokenProcessorConfig(size, s.string("hashSeed", ""), algorithm or "cbor-fnv")
    s.finish()
    return config


def _indexer(s: Section) -> IndexerConfig:
    s.reject(
        "tokenizersPoolConfig",
        "tokenizersPoolConfig is not supported; requests must carry token ids "
        "(configure a token producer upstream)",
    )
    index = s.section("kvBlockIndexConfig")
    for unsupported in ("costAwareMemoryConfig", "redisConfig", "valkeyConfig"):
        index.reject(unsupported, f"{unsupported} is not supported by ppc-extproc; use inMemoryConfig")
    index.boolean("enableMetrics", False)  # accepted: index metrics are always exported
    index.raw("metricsLoggingInterval")
    memory = index.section("inMemoryConfig")
    size = memory.integer("size", DEFAULT_INDEX_SIZE, minimum=2)
    pod_cache_size = memory.integer("podCacheSize", 10, minimum=1)
    memory.finish()
    index.finish()
    weights = dict(DEFAULT_TIER_WEIGHTS)
    if s.has("kvCacheBackendConfigs"):
        weights = {}
        for path, item in s.items("kvCacheBackendConfigs"):
            backend = s.sub(item, path, _OWNER)
            name = backend.string("name", "")
            if not name:
                raise ConfigError(f"{path}.name", "tier name must not be empty")
            weights[name.lower()] = backend.number("weight", 1.0, minimum=0.0)
            backend.finish()
    s.finish()
    return IndexerConfig(size=size, pod_cache_size=pod_cache_size, tier_weights=weights)


def _kv_events(s: Section) -> KVEventsConfig:
    discovery = s.section("podDiscoveryConfig")
    replay = discovery.integer("replaySocketPort", 0, maximum=65535)
    if replay < 0:  # llm-d replays only when replaySocketPort > 0 (pkg/kvevents/zmq_subscriber.go)
        discovery.warn("replaySocketPort", f"{replay} means no replay (as llm-d)")
        replay = 0
    pods = PodDiscoveryConfig(
        socket_port=discovery.integer("socketPort", 5557, minimum=1, maximum=65535),
        replay_socket_port=replay,
        pod_label_selector=discovery.string("podLabelSelector", "llm-d.ai/inference-serving=true"),
        pod_namespace=discovery.string("podNamespace", ""),
    )
    discovery.finish()
    engine = s.string("engineType", "vllm", choices=(*ENGINE_TYPES, "")) or "vllm"
    curve = None
    if s.has("curveConfig"):
        c = s.section("curveConfig")
        curve = CurveConfig(c.string("serverSecretKeyFile", ""), c.string("allowedPublisherKeys", ""))
        for key, value in (("serverSecretKeyFile", curve.server_secret_key_file),
                           ("allowedPublisherKeys", curve.allowed_publisher_keys)):
            if not value:
                raise ConfigError(c.child_path(key), "is required with curveConfig")
        c.finish()
    batch_window = s.duration("batchWindow", "1s")
    if not 0 <= batch_window <= MAX_BATCH_WINDOW_SECONDS:
        raise ConfigError(s.child_path("batchWindow"), f"must be between 0s and {MAX_BATCH_WINDOW_SECONDS:g}s, got {batch_window:g}s")
    config = KVEventsConfig(
        zmq_endpoint=s.string("zmqEndpoint", ""),
        topic_filter=s.string("topicFilter", "kv@"),
        concurrency=s.integer("concurrency", 4, minimum=1),
        engine_type=engine,
        discover_pods=s.boolean("discoverPods", True),
        pod_discovery=pods,
        queue_size=s.integer("queueSize", 10000, minimum=1),
        curve=curve,
        allow_unauthenticated_publishers=s.boolean("allowUnauthenticatedPublishers", False),
        batch_window_seconds=batch_window,
    )
    s.finish()
    return config


def _warm_restart(s: Section) -> WarmRestartConfig:
    config = WarmRestartConfig(
        state_dir=s.string("stateDir", ""),
        interval_seconds=s.duration("snapshotInterval", "60s"),
        max_bytes=s.integer("maxSnapshotBytes", 2 << 30, minimum=1024),
        restore_ttl_seconds=s.duration("restoreTTL", "5m"),
    )
    s.finish()
    return config


def _positive(s: Section, key: str, default: str) -> float:
    seconds = s.duration(key, default)
    if seconds <= 0:
        raise ConfigError(s.child_path(key), f"{key} must be greater than 0")
    return seconds


def parse_producer_config(params: Section) -> PrecisePrefixCacheProducerConfig:
    """Decode the producer's ``parameters`` (the caller runs ``params.finish()``)."""
    if "indexerConfig" in params.data and params.data["indexerConfig"] is None:
        raise ConfigError(params.child_path("indexerConfig"), "indexerConfig must not be null")
    return PrecisePrefixCacheProducerConfig(
        token_processor=_token_processor(params.section("tokenProcessorConfig")),
        indexer=_indexer(params.section("indexerConfig")),
        kv_events=_kv_events(params.section("kvEventsConfig")),
        speculative_indexing=params.boolean("speculativeIndexing", False),
        speculative_ttl_seconds=params.duration("speculativeTTL", "2s"),
        credit_decode_engine=params.boolean("creditDecodeEngine", True),
        decode_credit_ttl_seconds=_positive(params, "decodeCreditTTL", "120s"),
        warm_restart=_warm_restart(params.section("warmRestart")),
    )
