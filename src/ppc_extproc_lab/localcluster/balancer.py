"""A plain HTTP load balancer on loopback: Envoy round-robin over a list of upstreams.

What a Kubernetes Service (or a cloud load balancer) does in front of several replicas of an
HTTP router: each request goes to the next replica, none of them sees the others' traffic.
Envoy with one worker thread costs little CPU next to the routers it balances (it is the same
proxy that carries ppc-extproc's traffic), and streams SSE responses through unbuffered.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from ppc_extproc_lab.localcluster.envoy_config import find_envoy, split_host_port
from ppc_extproc_lab.localcluster.processes import ManagedProcess, ProcessGroup
from ppc_extproc_lab.localcluster.readiness import wait_for_http

__all__ = ["balancer_config", "start_balancer"]

_HCM = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
_ROUTER = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"


def balancer_config(listener_port: int, admin_port: int, upstreams: Sequence[str]) -> dict[str, Any]:
    """Envoy bootstrap: ``127.0.0.1:listener_port`` → ``upstreams`` (``host:port``) round-robin."""
    if not upstreams:
        raise ValueError("the balancer needs at least one upstream")
    endpoints = []
    for upstream in upstreams:
        host, port = split_host_port(upstream)
        endpoints.append({"endpoint": {"address": {"socket_address": {"address": host, "port_value": port}}}})
    limits = {"thresholds": [{"max_connections": 40000, "max_pending_requests": 40000, "max_requests": 40000}]}
    return {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin_port}}},
        "static_resources": {
            "listeners": [{
                "name": "balancer",
                "address": {"socket_address": {"address": "127.0.0.1", "port_value": listener_port}},
                "filter_chains": [{"filters": [{
                    "name": "envoy.filters.network.http_connection_manager",
                    "typed_config": {
                        "@type": _HCM,
                        "stat_prefix": "balancer",
                        "route_config": {"virtual_hosts": [{
                            "name": "all", "domains": ["*"],
                            "routes": [{"match": {"prefix": "/"},
                                        "route": {"cluster": "routers", "timeout": "0s", "idle_timeout": "86400s"}}],
                        }]},
                        "http_filters": [{"name": "envoy.filters.http.router",
                                          "typed_config": {"@type": _ROUTER, "suppress_envoy_headers": True}}],
                    },
                }]}],
            }],
            "clusters": [{
                "name": "routers",
                "type": "STATIC",
                "lb_policy": "ROUND_ROBIN",
                "connect_timeout": "5s",
                "circuit_breakers": limits,
                "load_assignment": {"cluster_name": "routers", "endpoints": [{"lb_endpoints": endpoints}]},
            }],
        },
    }  # fmt: skip


def start_balancer(
    group: ProcessGroup,
    upstreams: Sequence[str],
    *,
    listener_port: int,
    admin_port: int,
    timeout: float = 30.0,
    env: Mapping[str, str] | None = None,
    name: str = "balancer",
) -> ManagedProcess:
    """Write the config into ``group.log_dir``, start Envoy (one worker) in ``group``, wait for
    its admin ``/ready``; the listener is ``http://127.0.0.1:<listener_port>``."""
    path = Path(group.log_dir) / f"{name}.yaml"
    path.write_text(yaml.safe_dump(balancer_config(listener_port, admin_port, upstreams)), encoding="utf-8")
    argv = [find_envoy(), "-c", os.fspath(path), "--disable-hot-restart", "--concurrency", "1", "--log-level", "warn"]
    proc = group.spawn(name, argv, env=env)
    wait_for_http(f"http://127.0.0.1:{admin_port}/ready", timeout=timeout, process=proc)
    return proc
