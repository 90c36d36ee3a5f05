"""ext_proc over TLS from certificate/key files (``--tls-cert-file``/``--tls-key-file``), and
llm-d's ``--cert-path`` with ``--enable-cert-reload`` rotating them."""

from __future__ import annotations

import os
import shutil
import socket
import ssl
import subprocess
import sys
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
    from ppc_extproc.server.tls import tls_pair

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    cert, _ = self_signed(tmp_path / "a")
    _, other_key = self_signed(tmp_path / "b")
    with pytest.raises(ConfigError, match="the private key does not match the certificate"):
        tls_pair(str(cert), str(other_key))
    with pytest.raises(ConfigError, match="cannot read"):
        tls_pair(str(tmp_path / "missing.crt"), str(other_key))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _served_certificate(port: int) -> bytes | None:
    """The DER certificate a NEW connection to ``port`` is served, or None while it is not up."""
    try:
        return ssl.PEM_cert_to_DER_cert(ssl.get_server_certificate(("127.0.0.1", port), timeout=2))
    except OSError:
        return None


def _secret_volume(directory: Path, version: str, key: bytes, cert: bytes) -> None:
    """Write a pair as a Kubernetes Secret volume does: files in a versioned directory, the
    ``..data`` symlink swapped atomically, ``tls.crt``/``tls.key`` linking through it."""
    (directory / version).mkdir()
    (directory / version / "tls.crt").write_bytes(cert)
    (directory / version / "tls.key").write_bytes(key)
    (directory / "..data_tmp").symlink_to(version)
    os.replace(directory / "..data_tmp", directory / "..data")
    for name in ("tls.crt", "tls.key"):
        if not (directory / name).is_symlink():
            (directory / name).symlink_to(Path("..data") / name)


def test_enable_cert_reload_serves_a_rotated_certificate_on_new_connections(tmp_path: Path) -> None:
    from ppc_extproc.server.selfsigned import self_signed_pair
    from ppc_extproc_lab.localcluster import wait_for

    certs = tmp_path / "certs"
    certs.mkdir()
    first_key, first_cert = self_signed_pair(("first.example",))
    second_key, second_cert = self_signed_pair(("second.example",))
    _secret_volume(certs, "..v1", first_key, first_cert)
    port = _free_port()
    log = (tmp_path / "serve.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "ppc_extproc", "serve", "--grpc-address=127.0.0.1", f"--grpc-port={port}",
         "--admin-port=-1", "--endpoints=10.3.0.1:8000", "--secure-serving", f"--cert-path={certs}",
         "--enable-cert-reload"],
        stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        wait_for(lambda: _served_certificate(port) is not None, what="TLS on the ext_proc port", timeout=60)
        assert _served_certificate(port) == ssl.PEM_cert_to_DER_cert(first_cert.decode())
        # An open channel made with the first certificate.
        with grpc.secure_channel(f"127.0.0.1:{port}", grpc.ssl_channel_credentials(first_cert),
                                 options=[("grpc.ssl_target_name_override", "first.example")]) as old:
            health_pb2_grpc.HealthStub(old).Check(health_pb2.HealthCheckRequest(service="liveness"), timeout=5)
            _secret_volume(certs, "..v2", second_key, second_cert)
            wait_for(lambda: _served_certificate(port) == ssl.PEM_cert_to_DER_cert(second_cert.decode()),
                     what="the rotated certificate on a new connection", timeout=30)
            # The open connection keeps working; a new one routes over the new certificate.
            health_pb2_grpc.HealthStub(old).Check(health_pb2.HealthCheckRequest(service="liveness"), timeout=5)
        with grpc.secure_channel(f"127.0.0.1:{port}", grpc.ssl_channel_credentials(second_cert),
                                 options=[("grpc.ssl_target_name_override", "second.example")]) as new:
            stub = external_processor_pb2_grpc.ExternalProcessorStub(new)
            replies = list(stub.Process(iter([headers(), body(orjson.dumps({"model": "m", "prompt": [1, 2, 3]}))]),
                                        timeout=10))
            assert set_headers(replies[0])["x-gateway-destination-endpoint"] == "10.3.0.1:8000"
        # A broken pair (key of another certificate) is refused and the current one kept.
        third_key, _ = self_signed_pair(("third.example",))
        _secret_volume(certs, "..v3", third_key, first_cert)
        wait_for(lambda: _served_certificate(port) is not None  # a handshake looks at the files
                 and b"tls_certificate_reload_failed" in (tmp_path / "serve.log").read_bytes(),
                 what="the broken pair logged", timeout=30)
        assert _served_certificate(port) == ssl.PEM_cert_to_DER_cert(second_cert.decode())
        assert proc.poll() is None
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
