"""The shipped Envoy configs: in sync, shaped as documented, and rewritten only in addresses and ports."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from ppc_extproc_lab.localcluster import (
    DEFAULT_VARIANT,
    VARIANTS,
    LocalClusterError,
    envoy_config_file,
    envoy_config_text,
    load_envoy_config,
    render_envoy_config,
    rewrite_envoy_config,
)
from ppc_extproc_lab.localcluster.envoy_config import HEALTH_ATTRIBUTES, split_host_port

REPO = Path(__file__).resolve().parents[3]
TOP_LEVEL = REPO / "envoy"
PACKAGED = REPO / "src" / "ppc_extproc_lab" / "localcluster" / "envoy"
DEST = "x-gateway-destination-endpoint"


def _filters(config: dict[str, Any]) -> list[dict[str, Any]]:
    hcm = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0][
        "typed_config"
    ]
    return list(hcm["http_filters"])


def _ext_proc(config: dict[str, Any]) -> dict[str, Any]:
    (f,) = [f for f in _filters(config) if f["name"] == "envoy.filters.http.ext_proc"]
    return dict(f["typed_config"])


def _cluster(config: dict[str, Any], name: str) -> dict[str, Any]:
    (c,) = [c for c in config["static_resources"]["clusters"] if c["name"] == name]
    return dict(c)


def _route(config: dict[str, Any]) -> dict[str, Any]:
    hcm = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0][
        "typed_config"
    ]
    return dict(hcm["route_config"]["virtual_hosts"][0]["routes"][0]["route"])


def test_top_level_copies_match_packaged_files() -> None:
    packaged = sorted(p.name for p in PACKAGED.glob("*.yaml"))
    assert packaged == sorted(VARIANTS.values())
    assert sorted(p.name for p in TOP_LEVEL.glob("*.yaml")) == packaged, (
        "envoy/ and the package differ in files"
    )
    for name in packaged:
        assert (TOP_LEVEL / name).read_text() == (PACKAGED / name).read_text(), (
            f"envoy/{name} differs from src/ppc_extproc_lab/localcluster/envoy/{name}; "
            "edit one and copy it over the other"
        )


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_variant_loads_from_package_data(variant: str) -> None:
    assert envoy_config_file(variant).is_file()
    config = load_envoy_config(variant)
    assert config["admin"]["address"]["socket_address"] == {
        "address": "127.0.0.1",
        "port_value": 9901,
    }
    listener = config["static_resources"]["listeners"][0]
    assert listener["address"]["socket_address"] == {"address": "0.0.0.0", "port_value": 8081}
    ext_proc_ep = _cluster(config, "ext_proc")["load_assignment"]["endpoints"][0]["lb_endpoints"][0]
    assert ext_proc_ep["endpoint"]["address"]["socket_address"] == {
        "address": "ppc-extproc",
        "port_value": 9002,
    }


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_common_settings(variant: str) -> None:
    config = load_envoy_config(variant)
    names = [f["name"] for f in _filters(config)]
    # Client-sent destination headers are removed before the picker runs; the router comes last.
    assert names == [
        "envoy.filters.http.header_mutation",
        "envoy.filters.http.ext_proc",
        "envoy.filters.http.router",
    ]
    removed = [
        m["remove"] for m in _filters(config)[0]["typed_config"]["mutations"]["request_mutations"]
    ]
    assert DEST in removed
    ext = _ext_proc(config)
    assert ext["grpc_service"]["envoy_grpc"]["cluster_name"] == "ext_proc"
    assert ext["message_timeout"] == "1000s"
    assert ext["status_on_error"] == {"code": "ServiceUnavailable"}
    assert ext["metadata_options"] == {
        "forwarding_namespaces": {"untyped": ["envoy.lb.subset_hint", "envoy.lb"]},
        "receiving_namespaces": {"untyped": ["envoy.lb"]},
    }
    ext_cluster = _cluster(config, "ext_proc")
    (hc,) = ext_cluster["health_checks"]
    assert hc["grpc_health_check"]["service_name"] == "envoy.service.ext_proc.v3.ExternalProcessor"
    assert (
        "http2_protocol_options"
        in ext_cluster["typed_extension_protocol_options"][
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
        ]["explicit_http_config"]
    )
    route = _route(config)
    assert route["timeout"] == route["idle_timeout"] == "86400s"
    vhost_limit = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0][
        "typed_config"
    ]["route_config"]["virtual_hosts"][0]["request_body_buffer_limit"]
    assert vhost_limit >= 1_000_000  # a 100K-token prompt is ~0.7 MB of JSON


@pytest.mark.parametrize("variant", ["full-duplex", "override-host"])
def test_full_duplex_modes(variant: str) -> None:
    mode = _ext_proc(load_envoy_config(variant))["processing_mode"]
    assert mode == {
        "request_header_mode": "SEND",
        "response_header_mode": "SEND",
        "request_body_mode": "FULL_DUPLEX_STREAMED",
        "response_body_mode": "FULL_DUPLEX_STREAMED",
        "request_trailer_mode": "SEND",
        "response_trailer_mode": "SEND",
    }


def test_default_is_buffered_without_response_bodies() -> None:
    """envoy.yaml: one message each way per phase; the stream lives until the response ends
    (trailers SEND), and sampled requests may switch their response body on (mode_override)."""
    assert DEFAULT_VARIANT == "buffered" and VARIANTS["buffered"] == "envoy.yaml"
    ext = _ext_proc(load_envoy_config("buffered"))
    assert ext["processing_mode"] == {
        "request_header_mode": "SEND",
        "response_header_mode": "SEND",
        "request_body_mode": "BUFFERED",
        "response_body_mode": "NONE",
        "request_trailer_mode": "SKIP",
        "response_trailer_mode": "SEND",
    }
    assert ext["allow_mode_override"] is True


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_ext_proc_connection_allows_many_streams(variant: str) -> None:
    """Envoy's default of 1,024 streams per HTTP/2 connection is raised on the ext_proc cluster."""
    options = _cluster(load_envoy_config(variant), "ext_proc")["typed_extension_protocol_options"]
    http2 = options["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]["explicit_http_config"][
        "http2_protocol_options"
    ]
    assert http2["max_concurrent_streams"] >= 65536


@pytest.mark.parametrize("variant", ["full-duplex", "buffered"])
def test_original_dst_variants_fail_closed(variant: str) -> None:
    config = load_envoy_config(variant)
    assert _ext_proc(config)["failure_mode_allow"] is False
    assert _route(config)["cluster"] == "original_destination_cluster"
    cluster = _cluster(config, "original_destination_cluster")
    assert cluster["type"] == "ORIGINAL_DST"
    assert cluster["original_dst_lb_config"] == {"use_http_header": True, "http_header_name": DEST}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_variant_asks_envoy_whether_it_reached_the_engine(variant: str) -> None:
    """Endpoint health reads these attributes: suppress_envoy_headers removes the header that
    would otherwise tell an engine's own 5xx from a connection failure."""
    assert set(HEALTH_ATTRIBUTES) <= set(_ext_proc(load_envoy_config(variant))["response_attributes"])


def test_a_custom_file_without_the_attributes_gets_them() -> None:
    config = load_envoy_config("buffered")
    (ext_proc,) = [f["typed_config"] for f in _filters(config) if f["name"] == "envoy.filters.http.ext_proc"]
    del ext_proc["response_attributes"]
    rewritten = rewrite_envoy_config(config, listener_port=1, admin_port=2, ext_proc_port=3)
    assert _ext_proc(rewritten)["response_attributes"] == list(HEALTH_ATTRIBUTES)
    ext_proc["response_attributes"] = ["request.path", "response.flags"]
    rewritten = rewrite_envoy_config(config, listener_port=1, admin_port=2, ext_proc_port=3)
    assert _ext_proc(rewritten)["response_attributes"] == ["request.path", "response.flags", "response.code_details"]


def test_override_host_variant() -> None:
    config = load_envoy_config("override-host")
    assert _ext_proc(config)["failure_mode_allow"] is True
    route = _route(config)
    assert route["cluster"] == "model_servers"
    assert route["retry_policy"]["num_retries"] >= 1
    cluster = _cluster(config, "model_servers")
    (policy,) = cluster["load_balancing_policy"]["policies"]
    typed = policy["typed_extension_config"]
    assert typed["name"] == "envoy.load_balancing_policies.override_host"
    sources = typed["typed_config"]["override_host_sources"]
    assert sources[0] == {"header": DEST}
    assert sources[1] == {"metadata": {"key": "envoy.lb", "path": [{"key": DEST}]}}
    assert typed["typed_config"]["selected_host_key"] == {
        "key": "envoy.lb",
        "path": [{"key": DEST + "-served"}],
    }


def _without_local_fields(config: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(config)
    out["admin"]["address"] = None
    out["static_resources"]["listeners"][0]["address"] = None
    for cluster in out["static_resources"]["clusters"]:
        if cluster["name"] in ("ext_proc", "model_servers"):
            cluster["load_assignment"] = None
    _ext_proc(out)["grpc_service"]["envoy_grpc"]["authority"] = None
    return out


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_shipped_files_talk_tls_to_the_service_and_the_lab_drops_it_for_plaintext(variant: str) -> None:
    original = load_envoy_config(variant)
    tls = _cluster(original, "ext_proc")["transport_socket"]
    assert tls["name"] == "envoy.transport_sockets.tls"
    assert tls["typed_config"]["common_tls_context"]["alpn_protocols"] == ["h2"]
    kept = rewrite_envoy_config(original, listener_port=1, admin_port=2, ext_proc_port=3, ext_proc_tls=True)
    assert _cluster(kept, "ext_proc")["transport_socket"] == tls
    plain = rewrite_envoy_config(original, listener_port=1, admin_port=2, ext_proc_port=3)
    assert "transport_socket" not in _cluster(plain, "ext_proc")
    for cluster in original["static_resources"]["clusters"]:
        cluster.pop("transport_socket", None)
    with pytest.raises(LocalClusterError, match="no transport_socket"):
        rewrite_envoy_config(original, listener_port=1, admin_port=2, ext_proc_port=3, ext_proc_tls=True)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_rewrite_changes_only_addresses_and_ports(variant: str) -> None:
    original = load_envoy_config(variant)
    engines = ["127.0.0.2:18000", "127.0.0.3:18000"]
    local = rewrite_envoy_config(
        original,
        listener_port=1111,
        admin_port=2222,
        ext_proc_port=3333,
        upstream_endpoints=engines,
        ext_proc_tls=True,
    )
    assert original == load_envoy_config(variant), "the input must not be modified"
    assert _without_local_fields(local) == _without_local_fields(original)
    assert local["admin"]["address"]["socket_address"] == {
        "address": "127.0.0.1",
        "port_value": 2222,
    }
    listener = local["static_resources"]["listeners"][0]
    assert listener["address"]["socket_address"] == {"address": "127.0.0.1", "port_value": 1111}
    ext_lb = _cluster(local, "ext_proc")["load_assignment"]["endpoints"][0]["lb_endpoints"]
    assert [e["endpoint"]["address"]["socket_address"] for e in ext_lb] == [
        {"address": "127.0.0.1", "port_value": 3333}
    ]
    assert _ext_proc(local)["grpc_service"]["envoy_grpc"]["authority"] == "127.0.0.1:3333"
    if variant == "override-host":
        members = _cluster(local, "model_servers")["load_assignment"]["endpoints"][0][
            "lb_endpoints"
        ]
        assert [e["endpoint"]["address"]["socket_address"] for e in members] == [
            {"address": "127.0.0.2", "port_value": 18000},
            {"address": "127.0.0.3", "port_value": 18000},
        ]


def test_rewrite_rejects_unexpected_shapes() -> None:
    config = load_envoy_config("full-duplex")
    broken = copy.deepcopy(config)
    broken["static_resources"]["clusters"] = [
        c for c in broken["static_resources"]["clusters"] if c["name"] != "ext_proc"
    ]
    with pytest.raises(LocalClusterError, match="ext_proc"):
        rewrite_envoy_config(broken, listener_port=1, admin_port=2, ext_proc_port=3)
    two = copy.deepcopy(config)
    two["static_resources"]["listeners"].append(
        copy.deepcopy(two["static_resources"]["listeners"][0])
    )
    with pytest.raises(LocalClusterError, match="one listener"):
        rewrite_envoy_config(two, listener_port=1, admin_port=2, ext_proc_port=3)


def test_render_writes_loadable_yaml(tmp_path: Path) -> None:
    path = render_envoy_config(
        "override-host",
        tmp_path,
        listener_port=1,
        admin_port=2,
        ext_proc_port=3,
        upstream_endpoints=["[::1]:8000"],
    )
    rendered = yaml.safe_load(path.read_text())
    members = _cluster(rendered, "model_servers")["load_assignment"]["endpoints"][0]["lb_endpoints"]
    assert members[0]["endpoint"]["address"]["socket_address"] == {
        "address": "::1",
        "port_value": 8000,
    }


def test_render_accepts_a_file_path(tmp_path: Path) -> None:
    source = tmp_path / "mine.yaml"
    source.write_text(envoy_config_text("buffered"))
    path = render_envoy_config(
        source, tmp_path / "out", listener_port=1, admin_port=2, ext_proc_port=3
    )
    assert (
        _ext_proc(yaml.safe_load(path.read_text()))["processing_mode"]["request_body_mode"]
        == "BUFFERED"
    )


def test_unknown_variant() -> None:
    with pytest.raises(LocalClusterError, match="unknown Envoy config variant"):
        envoy_config_file("nope")
    with pytest.raises(LocalClusterError, match="neither a variant"):
        envoy_config_text("/nonexistent/envoy.yaml")


@pytest.mark.parametrize(
    ("endpoint", "expected"),
    [("10.0.0.5:8000", ("10.0.0.5", 8000)), ("[fd00::1]:8001", ("fd00::1", 8001))],
)
def test_split_host_port(endpoint: str, expected: tuple[str, int]) -> None:
    assert split_host_port(endpoint) == expected


@pytest.mark.parametrize("bad", ["10.0.0.5", ":80", "host:port"])
def test_split_host_port_rejects(bad: str) -> None:
    with pytest.raises(ValueError):
        split_host_port(bad)


def _ext_proc_members(config: dict[str, Any]) -> list[dict[str, Any]]:
    lb = _cluster(config, "ext_proc")["load_assignment"]["endpoints"][0]["lb_endpoints"]
    return [e["endpoint"]["address"]["socket_address"] for e in lb]


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_rewrite_lists_every_service_replica(variant: str) -> None:
    original = load_envoy_config(variant)
    local = rewrite_envoy_config(
        original,
        listener_port=1111,
        admin_port=2222,
        ext_proc_endpoints=["127.0.0.1:3333", "127.0.0.1:3334", "[::1]:3335"],
        ext_proc_tls=True,
    )
    assert _ext_proc_members(local) == [
        {"address": "127.0.0.1", "port_value": 3333},
        {"address": "127.0.0.1", "port_value": 3334},
        {"address": "::1", "port_value": 3335},
    ]
    # Everything else (the lb_policy that spreads the streams, health checks …) is the file's.
    assert _without_local_fields(local) == _without_local_fields(original)
    assert _cluster(local, "ext_proc")["lb_policy"] == _cluster(original, "ext_proc")["lb_policy"]
    assert _ext_proc(local)["grpc_service"]["envoy_grpc"]["authority"] == "127.0.0.1:3333"


def test_rewrite_one_replica_list_equals_the_single_port_form() -> None:
    config = load_envoy_config("full-duplex")
    single = rewrite_envoy_config(config, listener_port=1, admin_port=2, ext_proc_port=3)
    listed = rewrite_envoy_config(
        config, listener_port=1, admin_port=2, ext_proc_endpoints=["127.0.0.1:3"]
    )
    assert single == listed


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"ext_proc_port": 3, "ext_proc_endpoints": ["127.0.0.1:3"]}, {"ext_proc_endpoints": []}],
)
def test_rewrite_needs_exactly_one_ext_proc_form(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        rewrite_envoy_config(
            load_envoy_config("full-duplex"), listener_port=1, admin_port=2, **kwargs
        )


def test_render_with_replicas(tmp_path: Path) -> None:
    path = render_envoy_config(
        "buffered",
        tmp_path,
        listener_port=1,
        admin_port=2,
        ext_proc_endpoints=["127.0.0.1:7001", "127.0.0.1:7002"],
    )
    assert [m["port_value"] for m in _ext_proc_members(yaml.safe_load(path.read_text()))] == [
        7001,
        7002,
    ]
