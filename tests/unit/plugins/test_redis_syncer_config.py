"""``redis-syncer`` and ``dataLayer.crossReplicaSyncerPluginRef``: configuration, claim positions,
the peers' load view and the tracker's peer counts (no sockets: building the syncer connects to
nothing)."""

from __future__ import annotations

import pytest
import yaml

from ppc_extproc.config.epp import load_config_text
from ppc_extproc.errors import ConfigError
from ppc_extproc.ids import EndpointId
from ppc_extproc.plugins.datalayer.cross_replica_store import (
    PeerLoad,
    claim_positions,
    encode_load,
    parse_address,
)
from ppc_extproc.plugins.datalayer.redis_syncer import RedisSyncer
from ppc_extproc.scheduling.inflight import InflightTracker
from ppc_extproc.scheduling.rendezvous import rendezvous
from ppc_extproc_lab.localcluster.service_config import default_service_config, with_redis_syncer


def config(**layer: object) -> str:
    doc = with_redis_syncer(default_service_config(), "127.0.0.1:6390")
    doc["dataLayer"].update(layer)
    return yaml.safe_dump(doc)


def test_the_syncer_ref_wires_the_plugin_with_its_timing() -> None:
    loaded = load_config_text(config(crossReplicaSyncInterval="50ms", crossReplicaPublishTimeout="300ms"))
    syncer = loaded.pipeline.cross_replica
    assert isinstance(syncer, RedisSyncer)
    assert (syncer.sync_interval, syncer.publish_timeout, syncer.store.timeout_seconds) == (0.05, 0.3, 0.3)
    assert syncer in loaded.roles.lifecycle and not loaded.warnings


def test_without_the_ref_there_is_no_syncer() -> None:
    assert load_config_text(yaml.safe_dump(default_service_config())).pipeline.cross_replica is None


@pytest.mark.parametrize(("layer", "path", "says"), [
    ({"crossReplicaSyncerPluginRef": "nope"}, "dataLayer.crossReplicaSyncerPluginRef", "not registered"),
    ({"crossReplicaSyncerPluginRef": "max-score-picker"}, "dataLayer.crossReplicaSyncerPluginRef", "not a cross-replica syncer"),
    ({"crossReplicaSyncInterval": "0s"}, "dataLayer.crossReplicaSyncInterval", "positive"),
    ({"crossReplicaPublishTimeout": "soon"}, "dataLayer.crossReplicaPublishTimeout", ""),
])  # fmt: skip
def test_bad_data_layer_fields_name_the_field(layer: dict[str, object], path: str, says: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config_text(config(**layer))
    assert err.value.path == path and says in str(err.value)


@pytest.mark.parametrize(("params", "path", "says"), [
    ({"password": "x"}, "password", "plaintext"),
    ({"passwordEnv": "A", "passwordFile": "/x"}, "passwordFile", "mutually exclusive"),
    ({"passwordEnv": "PPC_TEST_UNSET_VARIABLE"}, "passwordEnv", "not set"),
    ({"address": "host:99999"}, "address", "bad port"),
    ({"stateTTL": "0s"}, "stateTTL", "at least 1ms"),
    ({"claimTimeout": 5}, "", ""),
    ({"sentinel": True}, "sentinel", "unknown key"),
    ({"coldPlacement": "hash"}, "coldPlacement", "rendezvous"),
    ({"changePublish": "now"}, "changePublish", "immediate"),
    ({"traceSize": -1}, "traceSize", ""),
    ({"traceSize": 2_000_000}, "traceSize", ""),
])  # fmt: skip
def test_bad_syncer_parameters_name_the_parameter(params: dict[str, object], path: str, says: str) -> None:
    doc = with_redis_syncer(default_service_config(), "127.0.0.1:6390")
    doc["plugins"][-1]["parameters"].update(params)
    if not path:
        load_config_text(yaml.safe_dump(doc))  # 5 (seconds) is a valid duration
        return
    with pytest.raises(ConfigError) as err:
        load_config_text(yaml.safe_dump(doc))
    assert err.value.path.endswith(f"parameters.{path}") and says in str(err.value)


def test_llmds_older_type_name_is_an_alias() -> None:
    doc = with_redis_syncer(default_service_config(), "redis://127.0.0.1:6390/2")
    doc["plugins"][-1]["type"] = "redis-state-store"
    doc["plugins"][-1]["name"] = "redis-syncer"
    syncer = load_config_text(yaml.safe_dump(doc)).pipeline.cross_replica
    assert isinstance(syncer, RedisSyncer) and syncer.type_name == "redis-syncer"


def test_cold_placement_and_trace_are_off_unless_asked() -> None:
    doc = with_redis_syncer(default_service_config(), "127.0.0.1:6390")
    syncer = load_config_text(yaml.safe_dump(doc)).pipeline.cross_replica
    assert isinstance(syncer, RedisSyncer) and not syncer.rendezvous and syncer.trace is None
    assert syncer.immediate is not None  # changePublish: immediate
    doc["plugins"][-1]["parameters"].update(coldPlacement="rendezvous", traceSize=10)
    syncer = load_config_text(yaml.safe_dump(doc)).pipeline.cross_replica
    assert isinstance(syncer, RedisSyncer) and syncer.rendezvous and syncer.trace is not None


def test_rendezvous_is_deterministic_spread_and_moves_only_a_removed_endpoints_keys() -> None:
    endpoints = [f"10.0.0.{i}:8000" for i in range(1, 5)]
    keys = [k * 0x9E3779B97F4A7C15 % (1 << 64) for k in range(1, 4001)]
    homes = {k: rendezvous(k, endpoints) for k in keys}
    assert homes == {k: rendezvous(k, list(reversed(endpoints))) for k in keys}  # order does not matter
    per_endpoint = [sum(1 for h in homes.values() if h == ep) for ep in endpoints]
    assert min(per_endpoint) > 0.8 * len(keys) / len(endpoints)
    fewer = endpoints[1:]
    assert all(rendezvous(k, fewer) == h for k, h in homes.items() if h != endpoints[0])


def test_addresses() -> None:
    assert parse_address("valkey:6380") == ("valkey", 6380, None)
    assert parse_address("redis://10.0.0.1:6379/3") == ("10.0.0.1", 6379, 3)
    assert parse_address("localhost") == ("localhost", 6379, None)
    assert parse_address("[::1]:6379") == ("::1", 6379, None)


def test_claim_positions_are_bounded_increasing_and_end_at_the_prompt() -> None:
    assert claim_positions(0) == [] and claim_positions(1) == [1]
    assert claim_positions(8) == [1, 2, 3, 4, 6, 8]
    for blocks in (2, 17, 68, 1000, 100_000):
        positions = claim_positions(blocks)
        assert positions[-1] == blocks and len(positions) <= 24
        assert all(a < b for a, b in zip(positions, positions[1:]))


def test_peer_load_ignores_its_own_messages_counts_malformed_ones_and_ages_peers_out() -> None:
    now = [100.0]
    peers = PeerLoad("me", state_ttl=2.0, clock=lambda: now[0])
    a, b = EndpointId("10.0.0.1:8000"), EndpointId("10.0.0.2:8000")
    assert not peers.receive(encode_load("me", {a: (5, 50)}))
    assert peers.receive(encode_load("r1", {a: (2, 20), b: (1, 0)})) and peers.new_peer
    assert peers.receive(encode_load("r1", {a: (2, 20), b: (1, 0)})) and not peers.new_peer
    now[0] += 1.5
    assert peers.receive(encode_load("r2", {a: (1, 5)}))
    assert peers.aggregate() == {a: (3, 25), b: (1, 0)} and peers.live() == 2
    for bad in (b"not json", b'{"r": "r3"}', b'{"r": "r3", "e": {"x": [1]}}', b"[1, 2]"):
        assert not peers.receive(bad)
    assert peers.malformed == 4
    now[0] += 1.0  # r1 silent for 2.5 s > stateTTL
    assert peers.aggregate() == {a: (1, 5)} and peers.live() == 1


def test_the_tracker_adds_the_peers_counts_and_reports_each_change() -> None:
    tracker = InflightTracker()
    changes: list[int] = []
    tracker.on_change = lambda: changes.append(1)
    a = EndpointId("10.0.0.1:8000")
    tracker.start("r1", a, 100)
    tracker.set_peer_load({a: (3, 300)})
    assert (tracker.requests(a), tracker.tokens(a)) == (4, 400)
    assert tracker.local_snapshot() == {a: (1, 100)}
    tracker.release_tokens("r1")
    assert tracker.finish("r1") and not tracker.finish("r1")
    assert len(changes) == 3
    assert tracker.snapshot() == {a: {"requests": 0, "tokens": 0, "peer_requests": 3, "peer_tokens": 300}}


def test_peer_load_drops_a_message_that_crossed_a_newer_one() -> None:
    peers = PeerLoad("me", state_ttl=2.0, clock=lambda: 0.0)
    a = EndpointId("10.0.0.1:8000")
    assert peers.receive(encode_load("r1", {a: (3, 0)}, seq=5))
    assert not peers.receive(encode_load("r1", {a: (2, 0)}, seq=4)) and peers.stale == 1
    assert peers.aggregate() == {a: (3, 0)}
    assert peers.receive(encode_load("r1", {a: (1, 0)}, seq=6)) and peers.aggregate() == {a: (1, 0)}
    assert peers.receive(encode_load("r1", {a: (4, 0)}))  # unnumbered (an older replica): taken
    peers.clear()
    assert peers.receive(encode_load("r1", {a: (2, 0)}, seq=1))  # after the store came back


def test_peer_load_is_bounded() -> None:
    peers = PeerLoad("me", state_ttl=2.0, clock=lambda: 0.0, max_peers=2)
    a = EndpointId("10.0.0.1:8000")
    assert peers.receive(encode_load("r1", {a: (1, 0)})) and peers.receive(encode_load("r2", {a: (1, 0)}))
    assert not peers.receive(encode_load("r3", {a: (1, 0)})) and peers.malformed == 1
    assert peers.aggregate() == {a: (2, 0)}


def test_store_health_is_exported() -> None:
    from prometheus_client import CollectorRegistry

    from ppc_extproc.framework import CrossReplicaStats, PluginState
    from ppc_extproc.observability.metrics import ServiceState, StateCollector

    stats = CrossReplicaStats(True, 2, {"adopted": 3, "kept": 5}, {"ok": 7, "error": 1})
    state = ServiceState({"10.0.0.1:8000": {"requests": 1, "tokens": 0, "peer_requests": 4, "peer_tokens": 0}}, 1,
                         [PluginState("redis-syncer", "redis-syncer", cross_replica=stats)])  # fmt: skip
    registry = CollectorRegistry()
    registry.register(StateCollector(lambda: state))
    value = registry.get_sample_value
    assert value("ppc_extproc_cross_replica_store_up", {"syncer": "redis-syncer"}) == 1.0
    assert value("ppc_extproc_cross_replica_peers", {"syncer": "redis-syncer"}) == 2.0
    assert value("ppc_extproc_cross_replica_claims_total", {"syncer": "redis-syncer", "outcome": "adopted"}) == 3.0
    assert value("ppc_extproc_cross_replica_sync_total", {"syncer": "redis-syncer", "outcome": "error"}) == 1.0
    assert value("ppc_extproc_inflight_peer_requests", {"endpoint": "10.0.0.1:8000"}) == 4.0
