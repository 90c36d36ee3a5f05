"""Pure parts of the launcher: loopback IPs, the service config patch, command lines."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from ppc_extproc_lab.localcluster import (
    DEFAULT_ENGINE_COMMAND,
    DEFAULT_SERVICE_COMMAND,
    LocalCluster,
    default_service_config,
    loopback_ips,
    patch_service_config,
)


def test_loopback_ips() -> None:
    assert loopback_ips(3) == ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
    assert loopback_ips(0) == []
    assert loopback_ips(2, first=255) == ["127.0.0.255", "127.0.1.0"]
    with pytest.raises(ValueError):
        loopback_ips(1, first=0)
    with pytest.raises(ValueError):
        loopback_ips(2, first=0xFFFFFE)


def _producer_params(config: dict) -> dict:  # type: ignore[type-arg]
    (p,) = [p for p in config["plugins"] if p["type"] == "precise-prefix-cache-producer"]
    return dict(p["parameters"])


def test_patch_sets_ports_and_block_size_without_touching_input() -> None:
    source = default_service_config()
    patched = patch_service_config(
        source, socket_port=40001, replay_socket_port=40002, block_size=64
    )
    params = _producer_params(patched)
    assert params["kvEventsConfig"]["podDiscoveryConfig"] == {
        "socketPort": 40001,
        "replaySocketPort": 40002,
    }
    assert params["tokenProcessorConfig"]["blockSizeTokens"] == 64
    assert "kvEventsConfig" not in _producer_params(source)  # the input is not modified


def test_patch_keeps_other_settings_and_fills_missing_sections() -> None:
    source = {
        "plugins": [
            {"type": "precise-prefix-cache-producer", "parameters": {"speculativeIndexing": True}},
            {"type": "precise-prefix-cache-producer"},
            {"type": "queue-scorer"},
        ],
        "kvEventsConfig": {"topicFilter": "kv@"},
    }
    patched = patch_service_config(source, socket_port=1, replay_socket_port=0)
    first, second, third = patched["plugins"]
    assert first["parameters"]["speculativeIndexing"] is True
    assert first["parameters"]["kvEventsConfig"]["podDiscoveryConfig"]["socketPort"] == 1
    assert "tokenProcessorConfig" not in first["parameters"]
    assert second["parameters"]["kvEventsConfig"]["podDiscoveryConfig"] == {
        "socketPort": 1,
        "replaySocketPort": 0,
    }
    assert third == {"type": "queue-scorer"}
    assert patched["kvEventsConfig"] == {
        "topicFilter": "kv@",
        "podDiscoveryConfig": {"socketPort": 1, "replaySocketPort": 0},
    }


def test_default_commands_run_the_package_module() -> None:
    assert (sys.executable, "-m", "ppc_extproc", "mock-vllm") == DEFAULT_ENGINE_COMMAND
    assert (sys.executable, "-m", "ppc_extproc", "serve") == DEFAULT_SERVICE_COMMAND


def test_command_lines(tmp_path: Path) -> None:
    """The flags each process gets (built without starting anything)."""
    cluster = LocalCluster(
        num_engines=2,
        block_size=64,
        engine_args=["--x"],
        per_engine_args=[["--a"], ["--b"]],
        log_dir=tmp_path,
    )
    cluster.log_dir = tmp_path
    cluster.engine_port, cluster.kv_events_port, cluster.replay_port = 18000, 15557, 15559
    cluster.grpc_port, cluster.service_admin_port = 19002, 19090
    cluster.service_config_path = tmp_path / "service-config.yaml"
    engine = cluster._engine_process(1).argv
    assert engine[: len(DEFAULT_ENGINE_COMMAND)] == list(DEFAULT_ENGINE_COMMAND)
    assert engine[len(DEFAULT_ENGINE_COMMAND) :] == [
        "--host", "127.0.0.3", "--port", "18000", "--model", "mock-model",
        "--kv-events-endpoint", "tcp://127.0.0.3:15557", "--replay-endpoint", "tcp://127.0.0.3:15559",
        "--block-size", "64", "--x", "--b",
    ]  # fmt: skip
    service = cluster._service_process().argv
    assert service[len(DEFAULT_SERVICE_COMMAND) :] == [
        "--grpc-port", "19002", "--admin-port", "19090", "--admin-address", "127.0.0.1",
        "--endpoints", "127.0.0.2:18000,127.0.0.3:18000", "--config-file", str(tmp_path / "service-config.yaml"),
    ]  # fmt: skip


def test_write_configs(tmp_path: Path) -> None:
    cluster = LocalCluster(num_engines=2, envoy_variant="override-host", log_dir=tmp_path)
    cluster.log_dir = tmp_path
    cluster.engine_port, cluster.kv_events_port, cluster.replay_port = 18000, 15557, 15559
    cluster.grpc_port, cluster.listener_port, cluster.envoy_admin_port = 19002, 18081, 19901
    cluster._write_configs()
    assert cluster.service_config_path is not None and cluster.envoy_config_path is not None
    service = yaml.safe_load(cluster.service_config_path.read_text())
    assert _producer_params(service)["kvEventsConfig"]["podDiscoveryConfig"] == {
        "socketPort": 15557,
        "replaySocketPort": 15559,
    }
    envoy = yaml.safe_load(cluster.envoy_config_path.read_text())
    (servers,) = [c for c in envoy["static_resources"]["clusters"] if c["name"] == "model_servers"]
    addrs = [
        m["endpoint"]["address"]["socket_address"]
        for m in servers["load_assignment"]["endpoints"][0]["lb_endpoints"]
    ]
    assert addrs == [
        {"address": "127.0.0.2", "port_value": 18000},
        {"address": "127.0.0.3", "port_value": 18000},
    ]


def test_user_service_config_file_is_patched(tmp_path: Path) -> None:
    user = tmp_path / "mine.yaml"
    user.write_text(
        yaml.safe_dump(
            {"plugins": [{"type": "precise-prefix-cache-producer", "parameters": {"x": 1}}]}
        )
    )
    cluster = LocalCluster(
        num_engines=1, service_config=user, with_envoy=False, replay=False, log_dir=tmp_path / "run"
    )
    cluster.log_dir = tmp_path / "run"
    cluster.log_dir.mkdir()
    cluster.kv_events_port = 15557
    cluster._write_configs()
    assert cluster.service_config_path is not None
    written = yaml.safe_load(cluster.service_config_path.read_text())
    assert _producer_params(written) == {
        "x": 1,
        "kvEventsConfig": {"podDiscoveryConfig": {"socketPort": 15557, "replaySocketPort": 0}},
    }
    assert cluster.envoy_config_path is None


def test_service_replicas_get_their_own_ports_and_one_envoy_cluster(tmp_path: Path) -> None:
    cluster = LocalCluster(num_engines=2, service_replicas=3, log_dir=tmp_path)
    cluster.log_dir = tmp_path
    cluster.allocate_ports()
    ports = [*cluster.grpc_ports, *cluster.service_admin_ports, cluster.listener_port]
    assert len(cluster.grpc_ports) == len(cluster.service_admin_ports) == 3
    assert len(set(ports)) == len(ports)
    assert cluster.grpc_port == cluster.grpc_ports[0]
    assert cluster.admin_url == cluster.service_admin_url == cluster.service_admin_urls[0]
    assert cluster.service_admin_urls == [f"http://127.0.0.1:{p}" for p in cluster.service_admin_ports]
    cluster._write_configs()
    for r in range(3):
        proc = cluster._service_process(r)
        assert proc.name == f"service-{r}"
        assert proc.log_path == tmp_path / f"service-{r}.log"
        argv = proc.argv
        assert argv[argv.index("--grpc-port") + 1] == str(cluster.grpc_ports[r])
        assert argv[argv.index("--admin-port") + 1] == str(cluster.service_admin_ports[r])
        assert argv[argv.index("--config-file") + 1] == str(cluster.service_config_path)
    assert cluster.envoy_config_path is not None
    envoy = yaml.safe_load(cluster.envoy_config_path.read_text())
    (ext_proc,) = [c for c in envoy["static_resources"]["clusters"] if c["name"] == "ext_proc"]
    members = [
        m["endpoint"]["address"]["socket_address"]
        for m in ext_proc["load_assignment"]["endpoints"][0]["lb_endpoints"]
    ]
    assert members == [{"address": "127.0.0.1", "port_value": p} for p in cluster.grpc_ports]


def test_one_replica_keeps_the_service_name(tmp_path: Path) -> None:
    cluster = LocalCluster(num_engines=1, log_dir=tmp_path)
    cluster.log_dir = tmp_path
    assert cluster.grpc_ports == [0] and cluster.service_process is None
    proc = cluster._service_process()
    assert (proc.name, proc.log_path) == ("service", tmp_path / "service.log")


def test_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError):
        LocalCluster(num_engines=-1)
    with pytest.raises(ValueError):
        LocalCluster(num_engines=1, service_replicas=0)
    with pytest.raises(ValueError):
        LocalCluster(num_engines=2, per_engine_args=[["--a"]])
