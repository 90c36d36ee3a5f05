"""A self-signed serving certificate made at start, as llm-d's EPP makes one for
``--secure-serving`` without ``--cert-path`` (``llm-d/llm-d-router: pkg/epp/server/runserver.go``).
Its clients (llm-d's gateway DestinationRule: ``insecureSkipVerify: true``) do not verify it; it
only encrypts. The Python standard library cannot create certificates, hence ``cryptography``.
"""

from __future__ import annotations

import datetime
import ipaddress

__all__ = ["self_signed_pair"]

#: llm-d's certificate is valid for 10 years (``pkg/sidecar/proxy/tls.go``).
_VALIDITY = datetime.timedelta(days=3650)


def self_signed_pair(hostnames: tuple[str, ...] = ("localhost",)) -> tuple[bytes, bytes]:
    """(private key, certificate) as PEM: RSA 2048 (generated in ~0.1 s; llm-d's 4096-bit takes
    seconds in Python and buys an unverified certificate nothing), server auth, SANs for
    ``hostnames`` and the loopback addresses."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "ppc-extproc"),
                      x509.NameAttribute(NameOID.COMMON_NAME, hostnames[0])])
    now = datetime.datetime.now(datetime.UTC)
    sans: list[x509.GeneralName] = [x509.DNSName(h) for h in hostnames]
    sans += [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.IPAddress(ipaddress.ip_address("::1"))]
    cert = (
        x509.CertificateBuilder()
        .subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + _VALIDITY)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.KeyUsage(digital_signature=True, key_encipherment=True, content_commitment=False,
                                     data_encipherment=False, key_agreement=False, key_cert_sign=False,
                                     crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return key_pem, cert.public_bytes(serialization.Encoding.PEM)
