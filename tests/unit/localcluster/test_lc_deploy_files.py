"""docker-compose.yaml, the Dockerfile and the Envoy files agree on addresses, ports and images."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from ppc_extproc_lab.localcluster import load_envoy_config

REPO = Path(__file__).resolve().parents[3]


def _compose() -> dict[str, Any]:
    data = yaml.safe_load((REPO / "docker-compose.yaml").read_text())
    assert isinstance(data, dict)
    return data


def _flag(command: list[str], name: str) -> str:
    for i, arg in enumerate(command):
        if arg == name:
            return command[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    raise AssertionError(f"{name} not in {command}")


def _engines(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        k: v for k, v in compose["services"].items() if v.get("command", [None])[0] == "mock-vllm"
    }


def test_engines_advertise_their_static_ip_and_port_8000() -> None:
    compose = _compose()
    engines = _engines(compose)
    assert len(engines) == 3
    subnet = compose["networks"]["inference"]["ipam"]["config"][0]["subnet"]
    prefix = subnet.rsplit(".", 1)[0] + "."
    for svc in engines.values():
        ip = svc["networks"]["inference"]["ipv4_address"]
        assert ip.startswith(prefix)
        cmd = svc["command"]
        assert _flag(cmd, "--host") == ip  # the topic / index id is ip:port
        assert _flag(cmd, "--port") == "8000"
        assert _flag(cmd, "--kv-events-endpoint") == f"tcp://{ip}:5557"
        assert _flag(cmd, "--replay-endpoint") == f"tcp://{ip}:5559"


def test_service_endpoints_match_engines() -> None:
    compose = _compose()
    expected = [
        f"{svc['networks']['inference']['ipv4_address']}:8000" for svc in _engines(compose).values()
    ]
    service = compose["services"]["ppc-extproc"]
    assert service["command"][0] == "serve"
    assert _flag(service["command"], "--endpoints").split(",") == expected
    assert _flag(service["command"], "--grpc-port") == "9002"
    config = yaml.safe_load(compose["configs"]["ppc-extproc-config"]["content"])
    (producer,) = [p for p in config["plugins"] if p["type"] == "precise-prefix-cache-producer"]
    discovery = producer["parameters"]["kvEventsConfig"]["podDiscoveryConfig"]
    assert discovery == {"socketPort": 5557, "replaySocketPort": 5559}


def test_envoy_service_mounts_the_default_config() -> None:
    compose = _compose()
    envoy = compose["services"]["envoy"]
    assert envoy["image"].startswith("envoyproxy/envoy:v1.40")
    assert "./envoy/envoy.yaml:/etc/envoy/envoy.yaml:ro" in envoy["volumes"]
    listener = load_envoy_config("full-duplex")["static_resources"]["listeners"][0]
    port = listener["address"]["socket_address"]["port_value"]
    assert f"{port}:{port}" in envoy["ports"]


def test_the_service_serves_tls_as_every_mounted_envoy_file_expects() -> None:
    command = _compose()["services"]["ppc-extproc"]["command"]
    assert "--secure-serving" in command
    for variant in ("buffered", "full-duplex", "override-host"):
        (ext_proc,) = [c for c in load_envoy_config(variant)["static_resources"]["clusters"] if c["name"] == "ext_proc"]
        assert ext_proc["transport_socket"]["name"] == "envoy.transport_sockets.tls"


def test_override_host_members_are_the_compose_engines() -> None:
    compose = _compose()
    expected = [
        {"address": svc["networks"]["inference"]["ipv4_address"], "port_value": 8000}
        for svc in _engines(compose).values()
    ]
    (cluster,) = [
        c
        for c in load_envoy_config("override-host")["static_resources"]["clusters"]
        if c["name"] == "model_servers"
    ]
    members = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"]
    assert [m["endpoint"]["address"]["socket_address"] for m in members] == expected


def test_dockerfile_entrypoint_and_user() -> None:
    text = (REPO / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["ppc-extproc"]' in text
    assert 'CMD ["serve"]' in text
    assert "USER 10001" in text
    assert text.count("FROM python:3.11-slim") == 2


def test_compose_service_config_loads_with_the_service_loader() -> None:
    """The config docker-compose hands the service is valid for the real loader."""
    import yaml

    from ppc_extproc.config.epp import load_config_text

    compose = yaml.safe_load((REPO / "docker-compose.yaml").read_text())
    loaded = load_config_text(compose["configs"]["ppc-extproc-config"]["content"])
    assert [p.type_name for p in loaded.roles.producers] == [
        "token-producer", "precise-prefix-cache-producer", "inflight-load-producer",  # the last injected
    ]
    assert loaded.roles.producers[0].backend_name == "local"  # chat and text get exact ids
    assert loaded.roles.producers[1].config.kv_events.pod_discovery.replay_socket_port == 5559
    assert loaded.warnings == []
