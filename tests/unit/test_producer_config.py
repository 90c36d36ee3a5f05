from __future__ import annotations

import pytest
import yaml

from ppc_extproc.errors import ConfigError
from ppc_extproc.framework.durations import parse_go_duration
from ppc_extproc.framework.params import Section
from ppc_extproc.plugins.producers.precise_prefix_cache_config import parse_producer_config

LLMD_EXAMPLE = yaml.safe_load(
    """
tokenProcessorConfig: {blockSizeTokens: 64}
speculativeIndexing: true
speculativeTTL: "2s"
indexerConfig:
  kvBlockIndexConfig: {enableMetrics: true}
  kvCacheBackendConfigs: [{name: gpu, weight: 1.0}, {name: cpu, weight: 0.8}]
kvEventsConfig:
  topicFilter: "kv@"
  concurrency: 8
  discoverPods: true
  podDiscoveryConfig: {socketPort: 5556, replaySocketPort: 5559}
"""
)


def parse(params: dict):
    section = Section(params, "plugins[0].parameters", owner="precise-prefix-cache-producer")
    config = parse_producer_config(section)
    section.finish()
    return config


def test_llmd_precise_prefix_parameters_load_unchanged() -> None:
    config = parse(LLMD_EXAMPLE)
    assert config.token_processor.block_size_tokens == 64
    assert config.speculative_indexing and config.speculative_ttl_seconds == 2.0
    assert config.indexer.tier_weights == {"gpu": 1.0, "cpu": 0.8}
    assert config.kv_events.pod_discovery.socket_port == 5556
    assert config.kv_events.pod_discovery.replay_socket_port == 5559


def test_defaults() -> None:
    config = parse({})
    assert config.token_processor.block_size_tokens == 16
    assert config.token_processor.hash_algorithm == "xxh64"
    assert config.indexer.pod_cache_size == 10
    assert config.kv_events.topic_filter == "kv@" and config.kv_events.discover_pods
    assert config.kv_events.batch_window_seconds == 1.0
    assert not config.speculative_indexing
    assert config.credit_decode_engine and config.decode_credit_ttl_seconds == 120.0


def test_batch_window_takes_a_duration_and_zero_turns_it_off() -> None:
    assert parse({"kvEventsConfig": {"batchWindow": "200ms"}}).kv_events.batch_window_seconds == 0.2
    assert parse({"kvEventsConfig": {"batchWindow": "0s"}}).kv_events.batch_window_seconds == 0.0


def test_decode_credit_parameters() -> None:
    config = parse({"creditDecodeEngine": False, "decodeCreditTTL": "30s"})
    assert not config.credit_decode_engine and config.decode_credit_ttl_seconds == 30.0


def test_deprecated_block_size_alias_and_precedence() -> None:
    assert parse({"tokenProcessorConfig": {"blockSize": 32}}).token_processor.block_size_tokens == 32
    both = {"tokenProcessorConfig": {"blockSize": 32, "blockSizeTokens": 64}}
    assert parse(both).token_processor.block_size_tokens == 64


def test_empty_hash_algorithm_means_llmd_default() -> None:
    assert parse({"tokenProcessorConfig": {"hashAlgorithm": ""}}).token_processor.hash_algorithm == "cbor-fnv"


@pytest.mark.parametrize(
    ("params", "path", "message"),
    [
        ({"bogus": 1}, "plugins[0].parameters.bogus", "unknown key 'bogus' of precise-prefix-cache-producer"),
        ({"tokenProcessorConfig": {"blockSizeTokens": -1}}, "plugins[0].parameters.tokenProcessorConfig.blockSizeTokens", "greater than 0"),
        ({"tokenProcessorConfig": {"hashAlgorithm": "md5"}}, "plugins[0].parameters.tokenProcessorConfig.hashAlgorithm", "must be one of"),
        ({"indexerConfig": {"tokenizersPoolConfig": {}}}, "plugins[0].parameters.indexerConfig.tokenizersPoolConfig", "token producer upstream"),
        ({"indexerConfig": None}, "plugins[0].parameters.indexerConfig", "must not be null"),
        ({"indexerConfig": {"kvBlockIndexConfig": {"redisConfig": {"address": "x"}}}}, "plugins[0].parameters.indexerConfig.kvBlockIndexConfig.redisConfig", "not supported"),
        ({"indexerConfig": {"kvBlockIndexConfig": {"inMemoryConfig": {"size": "big"}}}}, "plugins[0].parameters.indexerConfig.kvBlockIndexConfig.inMemoryConfig.size", "expected an integer, got str"),
        ({"kvEventsConfig": {"engineType": "trt"}}, "plugins[0].parameters.kvEventsConfig.engineType", "must be one of"),
        ({"kvEventsConfig": {"batchWindow": "2s"}}, "plugins[0].parameters.kvEventsConfig.batchWindow", "between 0s and 1s, got 2s"),
        ({"kvEventsConfig": {"batchWindow": -0.1}}, "plugins[0].parameters.kvEventsConfig.batchWindow", "between 0s and 1s"),
        ({"kvEventsConfig": {"batchWindow": "soon"}}, "plugins[0].parameters.kvEventsConfig.batchWindow", "soon"),
        ({"kvEventsConfig": {"podDiscoveryConfig": {"socketPort": 70000}}}, "plugins[0].parameters.kvEventsConfig.podDiscoveryConfig.socketPort", "at most 65535"),
        ({"speculativeTTL": "2 seconds"}, "plugins[0].parameters.speculativeTTL", "invalid duration"),
        ({"creditDecodeEngine": "no"}, "plugins[0].parameters.creditDecodeEngine", "expected true or false"),
        ({"decodeCreditTTL": "0s"}, "plugins[0].parameters.decodeCreditTTL", "greater than 0"),
        ({"speculativeIndexing": "yes"}, "plugins[0].parameters.speculativeIndexing", "expected true or false"),
        ({"indexerConfig": {"kvCacheBackendConfigs": [{"name": "gpu", "weight": -1}]}}, "plugins[0].parameters.indexerConfig.kvCacheBackendConfigs[0].weight", "at least 0"),
    ],
)
def test_errors_name_the_field(params: dict, path: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse(params)
    assert info.value.path == path
    assert message in info.value.message


@pytest.mark.parametrize(("text", "seconds"), [("2s", 2.0), ("500ms", 0.5), ("1m30s", 90.0), ("1.5h", 5400.0), ("0", 0.0), ("250us", 0.00025), ("-1s", -1.0)])
def test_go_durations(text: str, seconds: float) -> None:
    assert parse_go_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "2", "s", "2 s", "2d", "1s2"])
def test_bad_go_durations(text: str) -> None:
    with pytest.raises(ValueError):
        parse_go_duration(text)


@pytest.mark.parametrize("port", [-1, -5559])
def test_negative_replay_socket_port_means_off(port: int) -> None:
    """llm-d's zmq_subscriber.go replays only when ``replaySocketPort > 0``."""
    config = parse({"kvEventsConfig": {"podDiscoveryConfig": {"replaySocketPort": port}}})
    assert config.kv_events.pod_discovery.replay_socket_port == 0
