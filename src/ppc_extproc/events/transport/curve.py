"""ZMQ CURVE for the central SUB: key files, the loopback rule, and a ZAP handler.

Central mode binds one SUB that engines connect to, so anyone who reaches the port could publish
as any engine. With ``curveConfig`` the SUB is a CURVE server (``ZMQ_CURVE_SERVER``, its secret key
from a file) and a ZAP handler (RFC 27, ``inproc://zeromq.zap.01`` in the transport's context)
admits only the listed publisher public keys; every refused handshake is counted. The handler is a
REP socket on the ingestion thread's reactor: no extra thread, nothing to leak.

Key files hold a Z85 key (40 characters, as ``zmq.curve_keypair()`` prints it, e.g. a Kubernetes
secret's value mounted as a file) or a ZMQ certificate (``zmq.auth.create_certificates``). The
allowed keys are one file (one key per line; other lines starting with ``#`` are comments) or a directory of such files
(hidden entries, like a secret mount's ``..data``, are skipped).

Without ``curveConfig`` a central bind must be on loopback (``127.0.0.0/8``, ``::1``,
``localhost``, ``ipc://``, ``inproc://``), unless ``allowUnauthenticatedPublishers`` says so.
"""

from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth

from ppc_extproc.errors import ConfigError
from ppc_extproc.events.config import KVEventsConfig

__all__ = [
    "ZAP_ADDRESS",
    "ZAP_DOMAIN",
    "CurveKeys",
    "ZapHandler",
    "central_curve_keys",
    "is_loopback",
    "load_curve_keys",
]

ZAP_ADDRESS = "inproc://zeromq.zap.01"
ZAP_DOMAIN = "ppc-extproc-kv-events"
_Z85_KEY_CHARS = 40
#: Bounds of what key files may make us read and keep.
_MAX_KEY_FILE_BYTES = 1 << 20
MAX_ALLOWED_KEYS = 10_000
_PATH = "kvEventsConfig.curveConfig"


@dataclass(frozen=True, slots=True)
class CurveKeys:
    """The server's key pair and the publisher public keys it admits (all Z85)."""

    server_public: bytes
    server_secret: bytes
    allowed: frozenset[bytes]


def is_loopback(address: str) -> bool:
    """Whether a ZMQ bind address is reachable from this host only."""
    if address.startswith(("ipc://", "inproc://")):
        return True
    if not address.startswith("tcp://"):
        return False
    host = address[len("tcp://") :].rpartition(":")[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # "*", an interface name, a host name


def _text(path: str, field: str) -> str:
    try:
        with open(path, "rb") as f:
            data = f.read(_MAX_KEY_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{_PATH}.{field}", f"cannot read {path}: {exc.strerror}") from None
    if len(data) > _MAX_KEY_FILE_BYTES:
        raise ConfigError(f"{_PATH}.{field}", f"{path} is larger than {_MAX_KEY_FILE_BYTES} bytes")
    return data.decode("ascii", "replace")


def _z85(text: str, path: str, field: str) -> bytes:
    key = text.strip()
    if len(key) != _Z85_KEY_CHARS:
        raise ConfigError(f"{_PATH}.{field}", f"{path}: expected a {_Z85_KEY_CHARS}-character Z85 CURVE key")
    try:
        zmq.utils.z85.decode(key)
    except (ValueError, KeyError, struct.error):
        raise ConfigError(f"{_PATH}.{field}", f"{path}: not a Z85 CURVE key") from None
    return key.encode("ascii")


def _server_secret(path: str) -> bytes:
    text = _text(path, "serverSecretKeyFile")
    if "secret-key" in text:
        try:
            _, secret = zmq.auth.load_certificate(path)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{_PATH}.serverSecretKeyFile", f"{path}: {exc}") from None
        if secret is None:
            raise ConfigError(f"{_PATH}.serverSecretKeyFile", f"{path} holds no secret key")
        return secret
    return _z85(text, path, "serverSecretKeyFile")


def _public_keys(path: str) -> list[bytes]:
    text = _text(path, "allowedPublisherKeys")
    if "public-key" in text:
        try:
            public, _ = zmq.auth.load_certificate(path)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{_PATH}.allowedPublisherKeys", f"{path}: {exc}") from None
        return [public]
    # Z85 has "#" in its alphabet (never first in a 32-byte key): a 40-character line is a key,
    # another line starting with "#" a comment.
    lines = (line.strip() for line in text.splitlines())
    return [
        _z85(line, path, "allowedPublisherKeys")
        for line in lines
        if line and (len(line) == _Z85_KEY_CHARS or not line.startswith("#"))
    ]


def load_curve_keys(server_secret_key_file: str, allowed_publisher_keys: str) -> CurveKeys:
    """Read the key files (ConfigError naming the field on any problem)."""
    if not server_secret_key_file:
        raise ConfigError(f"{_PATH}.serverSecretKeyFile", "is required with curveConfig")
    if not allowed_publisher_keys:
        raise ConfigError(f"{_PATH}.allowedPublisherKeys", "is required with curveConfig")
    secret = _server_secret(server_secret_key_file)
    root = Path(allowed_publisher_keys)
    if root.is_dir():
        files = sorted(str(p) for p in root.iterdir() if not p.name.startswith(".") and p.is_file())
    else:
        files = [allowed_publisher_keys]
    allowed: set[bytes] = set()
    for file in files:
        allowed.update(_public_keys(file))
        if len(allowed) > MAX_ALLOWED_KEYS:
            raise ConfigError(f"{_PATH}.allowedPublisherKeys", f"more than {MAX_ALLOWED_KEYS} keys")
    if not allowed:
        raise ConfigError(f"{_PATH}.allowedPublisherKeys", f"no public key in {allowed_publisher_keys}")
    return CurveKeys(zmq.curve_public(secret), secret, frozenset(allowed))


def central_curve_keys(config: KVEventsConfig) -> CurveKeys | None:
    """The CURVE keys of a central SUB, or None when it may run unauthenticated; ConfigError when
    it binds beyond loopback without keys and without the explicit opt-out."""
    curve = config.curve
    if curve is not None:
        return load_curve_keys(curve.server_secret_key_file, curve.allowed_publisher_keys)
    if not is_loopback(config.zmq_endpoint) and not config.allow_unauthenticated_publishers:
        raise ConfigError(
            "kvEventsConfig.zmqEndpoint",
            f"central mode binds {config.zmq_endpoint} beyond loopback without authentication: set "
            "kvEventsConfig.curveConfig (serverSecretKeyFile, allowedPublisherKeys) or "
            "allowUnauthenticatedPublishers: true",
        )
    return None


class ZapHandler:
    """Answers libzmq's ZAP requests: CURVE clients whose public key is allowed get 200, everyone
    else 400. ``refused`` counts the denials."""

    def __init__(self, context: zmq.Context[zmq.Socket[bytes]], allowed: frozenset[bytes]) -> None:
        self._allowed = frozenset(zmq.utils.z85.decode(k) for k in allowed)
        self.sock: zmq.Socket[bytes] = context.socket(zmq.REP)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(ZAP_ADDRESS)
        self.accepted = 0
        self.refused = 0

    def drain(self, budget: int = 64) -> bool:
        """Answer pending requests; True when the budget ran out first."""
        for _ in range(budget):
            try:
                request = self.sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return False
            # [version, request id, domain, address, routing id, mechanism, credentials...]
            ok = (
                len(request) >= 7
                and request[0] == b"1.0"
                and request[5] == b"CURVE"
                and request[6] in self._allowed
            )
            if ok:
                self.accepted += 1
            else:
                self.refused += 1
            version = request[0] if request else b"1.0"
            request_id = request[1] if len(request) > 1 else b""
            status = (b"200", b"OK") if ok else (b"400", b"publisher key not allowed")
            self.sock.send_multipart([version, request_id, *status, b"", b""])
        return True

    def close(self) -> None:
        self.sock.close(0)
