"""llm-d's EPP flags for Kubernetes discovery → a KubernetesDiscoveryConfig, with llm-d's rules.

``llm-d/llm-d-router: pkg/epp/server/options.go`` (``Validate``, ``removeDuplicatePorts``) and
``cmd/epp/runner/runner.go`` (``resolvePoolNamespace``):

* exactly one of ``--pool-name`` and ``--endpoint-selector``, else
  ``either pool-name or endpoint-selector must be set``;
* ``--endpoint-target-ports`` (selector mode only): 1–8 ports, duplicates dropped, order = rank;
* ``--pool-namespace``: the flag, else ``$NAMESPACE``, else (ppc-extproc addition) the service
  account's namespace file in a pod, else ``default``;
* ``--pool-group``: ``inference.networking.k8s.io`` (v1, default) or the removed
  ``inference.networking.x-k8s.io`` (v1alpha2, mapped).

Kubernetes discovery excludes ``--endpoints`` and a configuration's ``dataLayer.discovery``: llm-d
lets the configured discovery win silently; here the combination is a startup error naming both.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ppc_extproc.discovery.kubernetes.auth import SERVICE_ACCOUNT_DIR, namespace_default
from ppc_extproc.discovery.kubernetes.discovery import KubernetesDiscoveryConfig
from ppc_extproc.discovery.kubernetes.pool import POOL_GROUP_V1, PoolParseError, validate_target_ports
from ppc_extproc.discovery.kubernetes.selector import LabelSelector, SelectorError
from ppc_extproc.errors import ConfigError

__all__ = ["KubernetesFlags", "config_from_flags"]


@dataclass(frozen=True, slots=True)
class KubernetesFlags:
    """The serve flags as given (None = not given)."""

    pool_name: str | None = None
    pool_namespace: str | None = None
    pool_group: str | None = None
    endpoint_selector: str | None = None
    endpoint_target_ports: str | None = None
    kubeconfig: str | None = None

    @property
    def kubernetes_mode(self) -> bool:
        return bool(self.pool_name) or bool(self.endpoint_selector)


def _parse_ports(text: str) -> tuple[int, ...]:
    flag = "--endpoint-target-ports"
    ports: list[Any] = []
    for item in text.split(","):
        if not item.strip().isdigit():
            raise ConfigError(flag, f"expected comma-separated port numbers (e.g. 8000,8001), got {text!r}")
        ports.append(int(item))
    try:
        return validate_target_ports(ports, flag, dedupe=True)
    except PoolParseError as exc:
        raise ConfigError(flag, str(exc).removeprefix(f"{flag}: ")) from None


def _configured_discovery(config_file: str | None) -> bool:
    """Whether the configuration file names a ``dataLayer.discovery`` (read only for that check)."""
    if not config_file:
        return False
    try:
        document = yaml.safe_load(Path(config_file).read_text())
    except (OSError, yaml.YAMLError):
        return False  # the real loader reports it with the field path
    data_layer = document.get("dataLayer") if isinstance(document, Mapping) else None
    return isinstance(data_layer, Mapping) and data_layer.get("discovery") is not None


def config_from_flags(flags: KubernetesFlags, *, endpoints_given: bool = False, config_file: str | None = None,
                      environ: Mapping[str, str] | None = None,
                      service_account_dir: Path = SERVICE_ACCOUNT_DIR) -> KubernetesDiscoveryConfig | None:
    """The discovery the flags ask for (None: no Kubernetes mode). Raises ConfigError naming the flag."""
    if not flags.kubernetes_mode:
        for flag, value in (("--pool-namespace", flags.pool_namespace), ("--pool-group", flags.pool_group),
                            ("--endpoint-target-ports", flags.endpoint_target_ports), ("--kubeconfig", flags.kubeconfig)):
            if value is not None:
                raise ConfigError(flag, "only applies with --pool-name or --endpoint-selector")
        return None
    mode = "--pool-name" if flags.pool_name else "--endpoint-selector"
    if flags.pool_name and flags.endpoint_selector:
        raise ConfigError("--pool-name", "either pool-name or endpoint-selector must be set, not both")
    if endpoints_given:
        raise ConfigError("--endpoints", f"cannot be combined with {mode}: pick static endpoints or Kubernetes discovery")
    if _configured_discovery(config_file):
        raise ConfigError("dataLayer.discovery", f"the configuration's discovery cannot be combined with {mode}")
    namespace = namespace_default(flags.pool_namespace, environ, service_account_dir)
    common: dict[str, Any] = {"namespace": namespace, "kubeconfig": flags.kubeconfig}
    if flags.pool_name:
        if flags.endpoint_target_ports is not None:
            raise ConfigError("--endpoint-target-ports", "only with --endpoint-selector; "
                              "in pool mode the InferencePool's spec.targetPorts rank the endpoints")
        return KubernetesDiscoveryConfig(pool_name=flags.pool_name, pool_group=flags.pool_group or POOL_GROUP_V1, **common)
    assert flags.endpoint_selector is not None
    try:
        selector = LabelSelector.parse(flags.endpoint_selector)
    except SelectorError as exc:
        raise ConfigError("--endpoint-selector", f"invalid endpoint-selector {flags.endpoint_selector!r}: {exc}") from None
    if flags.endpoint_target_ports is None:
        raise ConfigError("--endpoint-target-ports", "required with --endpoint-selector (1 to 8 ports, rank order)")
    if flags.pool_group is not None:
        raise ConfigError("--pool-group", "only with --pool-name")
    return KubernetesDiscoveryConfig(endpoint_selector=selector, target_ports=_parse_ports(flags.endpoint_target_ports),
                                     **common)
