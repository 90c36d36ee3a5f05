"""Which credentials discovery uses (controller-runtime's order) and the errors when there are none."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from ppc_extproc.discovery.kubernetes.auth import load_cluster_access
from ppc_extproc.errors import ConfigError


def kubeconfig(path: Path, server: str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"""apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "{server}"}}}}]
users: [{{name: u, user: {{token: tok}}}}]
contexts: [{{name: c, context: {{cluster: c, user: u}}}}]
current-context: c
""")
    return str(path)


def service_account(tmp_path: Path) -> Path:
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text("sa-token\n")
    (sa / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    return sa


def load(**kw: object) -> tuple[str, str, str]:
    access = asyncio.run(load_cluster_access(**kw))  # type: ignore[arg-type]
    return access.source.split()[0], access.configuration.host, access.configuration.api_key["BearerToken"]


def test_order_flag_then_env_then_in_cluster_then_home(tmp_path: Path) -> None:
    sa = service_account(tmp_path)
    in_cluster = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443", "HOME": str(tmp_path)}
    flag = kubeconfig(tmp_path / "flag", "http://127.0.0.1:1")
    env = kubeconfig(tmp_path / "env", "http://127.0.0.1:2")
    home = kubeconfig(tmp_path / ".kube" / "config", "http://127.0.0.1:3")
    assert load(kubeconfig=flag, environ={**in_cluster, "KUBECONFIG": env}, service_account_dir=sa)[1] == "http://127.0.0.1:1"
    assert load(environ={**in_cluster, "KUBECONFIG": env}, service_account_dir=sa)[1] == "http://127.0.0.1:2"
    assert load(environ=in_cluster, service_account_dir=sa) == ("in-cluster", "https://[fd00::1]:443", "Bearer sa-token")
    assert load(environ={"HOME": str(tmp_path)}, service_account_dir=sa) == ("kubeconfig", "http://127.0.0.1:3", "Bearer tok")
    assert home


@pytest.mark.parametrize(
    ("environ", "files", "path", "message"),
    [
        ({"HOME": "/nonexistent"}, {}, "--kubeconfig", "no Kubernetes API access"),
        ({"KUBERNETES_SERVICE_HOST": "10.96.0.1"}, {}, "kubernetes", "KUBERNETES_SERVICE_PORT must both be set"),
        ({"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}, {"token": "t"}, "kubernetes", "ca.crt does not exist"),
        ({"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}, {"ca.crt": "x"}, "kubernetes", "cannot read the service-account token"),
        ({"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}, {"ca.crt": "x", "token": " "}, "kubernetes", "is empty"),
        ({"KUBECONFIG": "/nonexistent/kubeconfig"}, {}, "--kubeconfig", "cannot load kubeconfig"),
    ],
)
def test_missing_credentials_name_what_is_missing(tmp_path: Path, environ: dict[str, str], files: dict[str, str],
                                                  path: str, message: str) -> None:
    sa = tmp_path / "sa"
    sa.mkdir()
    for name, text in files.items():
        (sa / name).write_text(text)
    with pytest.raises(ConfigError) as info:
        asyncio.run(load_cluster_access(environ=environ, service_account_dir=sa))
    assert info.value.path == path and message in info.value.message
