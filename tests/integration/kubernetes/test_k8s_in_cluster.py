"""In-cluster access: KUBERNETES_SERVICE_HOST/PORT, the service account's CA, token and namespace
files, TLS to the API server, and a rotated token picked up after the 401 it causes."""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
import ssl
import subprocess
from pathlib import Path

import pytest
from fake_apiserver import PODS, POOLS, FakeApiServer, inference_pool, pod
from k8s_harness import NAMESPACE, SERVING, TIMINGS, fake_api, running_service

from ppc_extproc.discovery.kubernetes import KubernetesDiscovery, KubernetesFlags, config_from_flags

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to make a certificate"),
]


def server_tls(tmp_path: Path) -> tuple[Path, ssl.SSLContext]:
    cert, key = tmp_path / "apiserver.crt", tmp_path / "apiserver.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=kubernetes",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    return cert, context


def test_in_cluster_service_account_over_tls_with_token_rotation(tmp_path: Path) -> None:
    async def scenario() -> None:
        cert, context = server_tls(tmp_path)
        sa = tmp_path / "serviceaccount"
        sa.mkdir()
        (sa / "token").write_text("token-1")
        (sa / "ca.crt").write_bytes(cert.read_bytes())
        (sa / "namespace").write_text(NAMESPACE)
        async with fake_api(tokens={"token-1"}, ssl_context=context) as fake:
            fake.put(POOLS, NAMESPACE, inference_pool("qwen-pool", {"app": "qwen"}, [8000]))
            fake.put(PODS, NAMESPACE, pod("qwen-0", "127.0.30.1"))
            env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(fake.port)}
            config = config_from_flags(KubernetesFlags(pool_name="qwen-pool"), environ=env, service_account_dir=sa)
            assert config is not None and config.namespace == NAMESPACE  # from the service account's namespace file
            discovery = KubernetesDiscovery(dataclasses.replace(config, timings=TIMINGS), environ=env,
                                            service_account_dir=sa)
            async with running_service(tmp_path, discovery, FakeApiServer.free_port()) as svc:
                await svc.expect({"127.0.30.1:8000": 0}, {"127.0.30.1:8000": svc.sub("127.0.30.1")}, "the first list")
                assert {r.token for r in fake.requests} == {"token-1"}
                # readiness follows the first complete list: the endpoint can be visible a moment before
                deadline = asyncio.get_running_loop().time() + 15
                while not svc.ready.is_set():
                    assert asyncio.get_running_loop().time() < deadline, "readiness after the first list"
                    await asyncio.sleep(0.02)
                assert await svc.health() == SERVING
                before = len(fake.requests)

                (sa / "token").write_text("token-2")  # the kubelet rotated the projected token
                fake.tokens = {"token-2"}
                fake.end_watches()
                fake.put(PODS, NAMESPACE, pod("qwen-1", "127.0.30.2"))
                await svc.expect({"127.0.30.1:8000": 0, "127.0.30.2:8000": 0},
                                 {"127.0.30.1:8000": svc.sub("127.0.30.1"), "127.0.30.2:8000": svc.sub("127.0.30.2")},
                                 "a change seen with the new token")
                later = fake.requests[before:]
                assert later[0].token == "token-1" and later[-1].token == "token-2"  # a 401, then the re-read token
                assert len(fake.calls("pods", "list")) == 1  # credentials renewed, watch resumed: no relist

    asyncio.run(asyncio.wait_for(scenario(), 120))
