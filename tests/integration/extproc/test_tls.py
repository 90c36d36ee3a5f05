"""ext_proc over TLS from certificate/key files (``--tls-cert-file``/``--tls-key-file``)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import grpc
import orjson
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from harness import body, headers, running_service, set_headers

pytestmark = pytest.mark.integration


def self_signed(tmp_path: Path) -> tuple[Path, Path]:
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )
    return cert, key


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to make a certificate")
def test_ext_proc_and_health_over_tls(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    with running_service(tmp_path, None, endpoints="10.3.0.1:8000", tls_cert_file=str(cert), tls_key_file=str(key)) as svc:
        credentials = grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())
        with grpc.secure_channel(f"127.0.0.1:{svc.grpc_port}", credentials) as channel:
            status = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service="readiness"), timeout=5)
            assert status.status == health_pb2.HealthCheckResponse.SERVING
            stub = external_processor_pb2_grpc.ExternalProcessorStub(channel)
            replies = list(stub.Process(iter([headers(), body(orjson.dumps({"model": "m", "prompt": [1, 2, 3]}))]), timeout=10))
            assert set_headers(replies[0])["x-gateway-destination-endpoint"] == "10.3.0.1:8000"
        with grpc.insecure_channel(f"127.0.0.1:{svc.grpc_port}") as plaintext, pytest.raises(grpc.RpcError):
            health_pb2_grpc.HealthStub(plaintext).Check(health_pb2.HealthCheckRequest(service=""), timeout=2)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to make a certificate")
def test_a_key_that_does_not_match_the_certificate_is_named(tmp_path: Path) -> None:
    from ppc_extproc.errors import ConfigError
    from ppc_extproc.server.app import _tls_pair

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    cert, _ = self_signed(tmp_path / "a")
    _, other_key = self_signed(tmp_path / "b")
    with pytest.raises(ConfigError, match="the private key does not match the certificate"):
        _tls_pair(str(cert), str(other_key))
    with pytest.raises(ConfigError, match="cannot read"):
        _tls_pair(str(tmp_path / "missing.crt"), str(other_key))
