"""llm-d's EPP flag rules (llm-d/llm-d-router: pkg/epp/server/options_test.go TestEndpointTargetPorts,
cmd/epp/runner/runner.go resolvePoolNamespace) and the exclusions with other endpoint sources."""

from __future__ import annotations

from pathlib import Path

import pytest

from ppc_extproc.cli import build_parser
from ppc_extproc.discovery.kubernetes import KubernetesDiscoveryConfig, KubernetesFlags, config_from_flags
from ppc_extproc.discovery.kubernetes.selector import LabelSelector
from ppc_extproc.errors import ConfigError


def config(flags: KubernetesFlags, tmp_path: Path, env: dict[str, str] | None = None, **kw: object) -> KubernetesDiscoveryConfig | None:
    return config_from_flags(flags, environ=env or {}, service_account_dir=tmp_path / "no-sa", **kw)  # type: ignore[arg-type]


def test_no_kubernetes_flags_means_no_kubernetes_discovery(tmp_path: Path) -> None:
    assert config(KubernetesFlags(), tmp_path) is None


def test_pool_mode(tmp_path: Path) -> None:
    got = config(KubernetesFlags(pool_name="qwen-pool", pool_namespace="llm"), tmp_path)
    assert got is not None
    assert (got.pool_name, got.namespace, got.pool_group, got.endpoint_selector) == (
        "qwen-pool", "llm", "inference.networking.k8s.io", None)


def test_selector_mode_dedupes_ports_in_rank_order(tmp_path: Path) -> None:
    got = config(KubernetesFlags(endpoint_selector="app=vllm", endpoint_target_ports="8001,8000,8001"), tmp_path)
    assert got is not None
    assert got.endpoint_selector == LabelSelector.parse("app=vllm") and got.target_ports == (8001, 8000)


@pytest.mark.parametrize(
    ("env", "sa_namespace", "expected"),
    [
        ({}, None, "default"),
        ({"NAMESPACE": "from-env"}, "from-file", "from-env"),
        ({}, "from-file", "from-file"),
    ],
)
def test_namespace_defaults(tmp_path: Path, env: dict[str, str], sa_namespace: str | None, expected: str) -> None:
    sa = tmp_path / "sa"
    sa.mkdir()
    if sa_namespace is not None:
        (sa / "namespace").write_text(sa_namespace + "\n")
    got = config_from_flags(KubernetesFlags(pool_name="p"), environ=env, service_account_dir=sa)
    assert got is not None and got.namespace == expected
    flagged = config_from_flags(KubernetesFlags(pool_name="p", pool_namespace="flag"), environ=env, service_account_dir=sa)
    assert flagged is not None and flagged.namespace == "flag"


@pytest.mark.parametrize(
    ("flags", "flag", "message"),
    [
        (KubernetesFlags(pool_name="p", endpoint_selector="app=x"), "--pool-name", "either pool-name or endpoint-selector must be set"),
        (KubernetesFlags(endpoint_selector="app=x"), "--endpoint-target-ports", "required with --endpoint-selector"),
        (KubernetesFlags(endpoint_selector="app=x", endpoint_target_ports=""), "--endpoint-target-ports", "expected comma-separated port numbers"),
        (KubernetesFlags(endpoint_selector="app=x", endpoint_target_ports="1,2,3,4,5,6,7,8,9"), "--endpoint-target-ports", "should have length from 1 to 8"),
        (KubernetesFlags(endpoint_selector="app=x", endpoint_target_ports="70000"), "--endpoint-target-ports", "expected a port number 1-65535"),
        (KubernetesFlags(endpoint_selector="app in (x", endpoint_target_ports="8000"), "--endpoint-selector", "invalid endpoint-selector"),
        (KubernetesFlags(pool_name="p", endpoint_target_ports="8000"), "--endpoint-target-ports", "only with --endpoint-selector"),
        (KubernetesFlags(pool_name="p", pool_group="example.com"), "--pool-group", "must be one of"),
        (KubernetesFlags(endpoint_selector="app=x", endpoint_target_ports="8000", pool_group="inference.networking.k8s.io"), "--pool-group", "only with --pool-name"),
        (KubernetesFlags(pool_namespace="llm"), "--pool-namespace", "only applies with --pool-name or --endpoint-selector"),
        (KubernetesFlags(endpoint_target_ports="8000"), "--endpoint-target-ports", "only applies"),
    ],
)
def test_flag_errors_name_the_flag(tmp_path: Path, flags: KubernetesFlags, flag: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        config(flags, tmp_path)
    assert info.value.path == flag and message in info.value.message


def test_excludes_static_endpoints_and_configured_discovery(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        config(KubernetesFlags(pool_name="p"), tmp_path, endpoints_given=True)
    assert info.value.path == "--endpoints" and "--pool-name" in info.value.message
    epp = tmp_path / "epp.yaml"
    epp.write_text("plugins:\n- type: file-discovery\n  parameters: {path: /x}\ndataLayer:\n  discovery: {pluginRef: file-discovery}\n")
    with pytest.raises(ConfigError) as info:
        config(KubernetesFlags(endpoint_selector="app=x", endpoint_target_ports="8000"), tmp_path, config_file=str(epp))
    assert info.value.path == "dataLayer.discovery" and "--endpoint-selector" in info.value.message
    epp.write_text("plugins: [{type: max-score-picker}]\n")
    assert config(KubernetesFlags(pool_name="p"), tmp_path, config_file=str(epp)) is not None


def test_serve_accepts_llm_d_flag_names() -> None:
    args = build_parser().parse_args([
        "serve", "--pool-name", "qwen-pool", "--pool-namespace", "llm", "--pool-group", "inference.networking.k8s.io",
        "--kubeconfig", "/tmp/kc",
    ])
    assert (args.pool_name, args.pool_namespace, args.pool_group, args.kubeconfig) == (
        "qwen-pool", "llm", "inference.networking.k8s.io", "/tmp/kc")
    args = build_parser().parse_args(["serve", "--endpoint-selector", "app=vllm", "--endpoint-target-ports", "8000,8001"])
    assert (args.endpoint_selector, args.endpoint_target_ports) == ("app=vllm", "8000,8001")
