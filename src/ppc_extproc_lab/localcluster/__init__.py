"""Run Envoy, mock vLLM engines and ppc-extproc on loopback: for the demo, integration tests and benchmarks.

Importing this package starts nothing. :class:`LocalCluster` is the entry point; the modules
below it are usable on their own:

* :mod:`~ppc_extproc_lab.localcluster.layout` — where every process listens (``ClusterLayout``);
* :mod:`~ppc_extproc_lab.localcluster.ports` — loopback IPs per engine, free ports;
* :mod:`~ppc_extproc_lab.localcluster.processes` — process groups that are always reaped;
* :mod:`~ppc_extproc_lab.localcluster.readiness` — waits with deadlines (TCP, HTTP, gRPC health);
* :mod:`~ppc_extproc_lab.localcluster.envoy_config` — the shipped Envoy configs and their local rewrite;
* :mod:`~ppc_extproc_lab.localcluster.service_config` — the service config pointed at the engines;
* :mod:`~ppc_extproc_lab.localcluster.pd` — P/D roles: decode pods (sidecar + engine), labelled file discovery.
"""

from __future__ import annotations

from ppc_extproc_lab.localcluster._errors import LocalClusterError, ReadinessError
from ppc_extproc_lab.localcluster.cluster import (
    DEFAULT_ENGINE_COMMAND,
    DEFAULT_SERVICE_COMMAND,
    LocalCluster,
)
from ppc_extproc_lab.localcluster.envoy_config import (
    DEFAULT_VARIANT,
    VARIANTS,
    envoy_config_file,
    envoy_config_text,
    find_envoy,
    load_envoy_config,
    render_envoy_config,
    rewrite_envoy_config,
)
from ppc_extproc_lab.localcluster.layout import ClusterLayout
from ppc_extproc_lab.localcluster.ports import (
    PortAllocator,
    check_loopback_ip,
    free_port,
    is_port_free,
    loopback_ips,
)
from ppc_extproc_lab.localcluster.processes import ManagedProcess, ProcessGroup, stop_all_processes
from ppc_extproc_lab.localcluster.readiness import wait_for, wait_for_grpc_health, wait_for_http, wait_for_tcp
from ppc_extproc_lab.localcluster.service_config import default_service_config, patch_service_config

__all__ = [
    "DEFAULT_ENGINE_COMMAND",
    "DEFAULT_SERVICE_COMMAND",
    "DEFAULT_VARIANT",
    "VARIANTS",
    "ClusterLayout",
    "LocalCluster",
    "LocalClusterError",
    "ManagedProcess",
    "PortAllocator",
    "ProcessGroup",
    "ReadinessError",
    "check_loopback_ip",
    "default_service_config",
    "envoy_config_file",
    "envoy_config_text",
    "find_envoy",
    "free_port",
    "is_port_free",
    "load_envoy_config",
    "loopback_ips",
    "patch_service_config",
    "render_envoy_config",
    "rewrite_envoy_config",
    "stop_all_processes",
    "wait_for",
    "wait_for_grpc_health",
    "wait_for_http",
    "wait_for_tcp",
]
