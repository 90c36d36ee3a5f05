"""TLS on the ext_proc port: certificate files checked at start, optionally reloaded when they
change (llm-d's ``--enable-cert-reload``: ``llm-d/llm-d-router: pkg/epp/server/runserver.go`` hands
each new TLS handshake the latest certificate of ``--cert-path`` from its ``CertReloader``), or a
self-signed certificate made at start."""

from __future__ import annotations

import os
import ssl
from pathlib import Path

import grpc
import structlog

from ppc_extproc.errors import ConfigError

__all__ = ["CertReloader", "server_credentials", "tls_pair"]

log = structlog.get_logger(__name__)


def tls_pair(cert_file: str, key_file: str) -> tuple[bytes, bytes]:
    """(key, certificate) PEM bytes, checked to load and to match — gRPC only says "Failed to bind"."""
    pem: dict[str, bytes] = {}
    for flag, path in (("--tls-cert-file", cert_file), ("--tls-key-file", key_file)):
        try:
            pem[flag] = Path(path).read_bytes()
        except OSError as exc:
            raise ConfigError(flag, f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert_file, key_file)
    except ssl.SSLError as exc:
        reason = "the private key does not match the certificate" if "KEY_VALUES_MISMATCH" in str(exc) else str(exc)
        raise ConfigError("--tls-key-file", f"{key_file} and {cert_file} cannot serve TLS: {reason}") from None
    return pem["--tls-key-file"], pem["--tls-cert-file"]


_Stamp = tuple[tuple[int, int, int], ...]


class CertReloader:
    """The certificate gRPC asks for before every new TLS handshake (``cert_config_fetcher`` of
    ``grpc.dynamic_ssl_server_credentials``): the files are stat'ed (two ``stat`` calls, no read),
    and re-read only when their inode, size or mtime changed. ``os.stat`` follows symlinks, so a
    Kubernetes Secret volume's atomic ``..data`` swap counts as a change. A pair that does not load
    (half written, key and certificate not matching yet) is logged and the current one kept; the
    next write changes the stamp again and is tried then."""

    def __init__(self, cert_file: str, key_file: str) -> None:
        self._files = (cert_file, key_file)
        self._stamp = self._stat()
        self.pair = tls_pair(cert_file, key_file)
        #: Certificates loaded after the first.
        self.reloads = 0

    def _stat(self) -> _Stamp:
        stats = [os.stat(path) for path in self._files]
        return tuple((s.st_ino, s.st_size, s.st_mtime_ns) for s in stats)

    def credentials(self) -> grpc.ServerCredentials:
        """Server credentials that serve the current pair and check for a new one per handshake."""
        return grpc.dynamic_ssl_server_credentials(self._configuration(), self.fetch)

    def _configuration(self) -> grpc.ServerCertificateConfiguration:
        return grpc.ssl_server_certificate_configuration([self.pair])

    def fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """A new configuration when the files changed and load, else None (keep the current one)."""
        try:
            stamp = self._stat()
        except OSError as exc:
            if self._stamp:
                log.warning("tls_certificate_reload_failed", reason=str(exc))
            self._stamp = ()
            return None
        if stamp == self._stamp:
            return None
        self._stamp = stamp
        try:
            self.pair = tls_pair(*self._files)
        except ConfigError as exc:
            log.warning("tls_certificate_reload_failed", reason=str(exc))
            return None
        self.reloads += 1
        log.info("tls_certificate_reloaded", cert_file=self._files[0], reloads=self.reloads)
        return self._configuration()


def server_credentials(
    cert_file: str | None, key_file: str | None, *, self_signed: bool, reload: bool
) -> grpc.ServerCredentials | None:
    """The ext_proc port's TLS credentials: from the files (reloaded on change with ``reload``), or
    self-signed, or None for plaintext."""
    if cert_file or key_file:
        if not (cert_file and key_file):
            raise ConfigError("--tls-cert-file", "TLS needs both --tls-cert-file and --tls-key-file")
        if reload:
            return CertReloader(cert_file, key_file).credentials()
        return grpc.ssl_server_credentials([tls_pair(cert_file, key_file)])
    if self_signed:
        from ppc_extproc.server.selfsigned import self_signed_pair

        log.info("extproc_tls_self_signed")
        return grpc.ssl_server_credentials([self_signed_pair()])
    return None
