"""P/D pieces of a local cluster: engine roles, the decode pods' sidecars, and labelled file discovery.

A P/D cluster is laid out like llm-d's pods on loopback addresses:

* a **prefill** engine serves on ``<ip>:<engine_port>`` itself;
* a **decode** pod is the sidecar on ``<ip>:<engine_port>`` (what the router sees and Envoy
  sends to) in front of the decode mock on ``<ip>:<decoder_port>``; the mock publishes KV events on
  ``tcp://<ip>:<kv_events_port>`` with the topic ``kv@<ip>:<engine_port>@<model>``, so its events
  are the endpoint's, as a pod's vLLM (port 8200) behind its sidecar (8000) is;
* every engine is listed in an endpoints file with the label ``llm-d.ai/role`` and the service
  reads it with ``file-discovery`` (instead of ``--endpoints``).
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import yaml

__all__ = [
    "DISCOVERY_PLUGIN",
    "ROLES",
    "ROLE_LABEL",
    "SIDECAR_COMMAND",
    "check_roles",
    "endpoints_document",
    "sidecar_argv",
    "with_file_discovery",
    "write_endpoints",
]

#: ``llm-d/llm-d-router: pkg/epp/framework/plugins/scheduling/filter/bylabel/roles.go``.
ROLE_LABEL: Final = "llm-d.ai/role"
#: Roles a lab engine may have: "" is unlabeled (a plain engine, which the decode filter keeps).
ROLES: Final = ("", "prefill", "decode", "both", "prefill-decode", "encode", "encode-prefill", "encode-prefill-decode")
SIDECAR_COMMAND: Final[tuple[str, ...]] = (sys.executable, "-m", "ppc_extproc_lab.pd_sidecar")
#: The name of the file-discovery plugin the cluster adds to the service config.
DISCOVERY_PLUGIN: Final = "lab-endpoints"


def check_roles(roles: Sequence[str], num_engines: int) -> list[str]:
    """The roles as a list, one per engine; ValueError naming a bad one."""
    if len(roles) != num_engines:
        raise ValueError(f"roles needs one entry per engine ({num_engines}), got {len(roles)}")
    for role in roles:
        if role not in ROLES:
            raise ValueError(f"role {role!r} is not one of {', '.join(repr(r) for r in ROLES)}")
    return list(roles)


def endpoints_document(ips: Sequence[str], port: int, roles: Sequence[str]) -> list[dict[str, Any]]:
    """The file-discovery document: one entry per engine, labelled with its role."""
    out: list[dict[str, Any]] = []
    for i, (ip, role) in enumerate(zip(ips, roles, strict=True)):
        entry: dict[str, Any] = {"name": f"{role or 'engine'}-{i}", "address": ip, "port": port}
        if role:
            entry["labels"] = {ROLE_LABEL: role}
        out.append(entry)
    return out


def with_file_discovery(config: Mapping[str, Any], endpoints_path: Path) -> dict[str, Any]:
    """A copy of ``config`` whose endpoints come from ``endpoints_path`` (any other discovery is
    replaced: the lab's engines are the pool)."""
    out: dict[str, Any] = copy.deepcopy(dict(config))
    plugins = [p for p in out.get("plugins") or [] if not (isinstance(p, dict) and p.get("type") == "file-discovery")]
    plugins.append({"type": "file-discovery", "name": DISCOVERY_PLUGIN, "parameters": {"path": str(endpoints_path)}})
    out["plugins"] = plugins
    data_layer = out.get("dataLayer")
    if not isinstance(data_layer, dict):
        data_layer = out["dataLayer"] = {}
    data_layer["discovery"] = {"pluginRef": DISCOVERY_PLUGIN}
    return out


def write_endpoints(path: Path, ips: Sequence[str], port: int, roles: Sequence[str]) -> Path:
    """Write the endpoints file; returns ``path``."""
    path.write_text(yaml.safe_dump(endpoints_document(ips, port, roles), sort_keys=False), encoding="utf-8")
    return path


def sidecar_argv(
    ip: str, port: int, decoder_port: int, *, kv_connector: str, extra: Sequence[str] = (),
    command: Sequence[str] = SIDECAR_COMMAND,
) -> list[str]:
    """The command line of the sidecar of the decode pod at ``ip``."""
    return [
        *command, "--host", ip, "--port", str(port),
        "--decoder-url", f"http://{ip}:{decoder_port}", "--kv-connector", kv_connector, *extra,
    ]  # fmt: skip
