"""The certificate ``--secure-serving`` makes at start loads as a server certificate."""

from __future__ import annotations

import ssl
from pathlib import Path

from cryptography import x509

from ppc_extproc.server.selfsigned import self_signed_pair


def test_self_signed_pair_loads_and_names_localhost(tmp_path: Path) -> None:
    key, cert = self_signed_pair()
    (tmp_path / "tls.key").write_bytes(key)
    (tmp_path / "tls.crt").write_bytes(cert)
    ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
    parsed = x509.load_pem_x509_certificate(cert)
    sans = parsed.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "localhost" in sans.get_values_for_type(x509.DNSName)
    assert (parsed.not_valid_after_utc - parsed.not_valid_before_utc).days >= 3650
    assert self_signed_pair()[1] != cert  # a fresh key and serial each start
