"""Loopback addresses and free TCP ports for a local cluster.

Each mock engine gets its own loopback IP (127.0.0.2, 127.0.0.3, …; Linux routes all of 127/8 to
``lo``), so that, like pods in Kubernetes, every engine serves HTTP and publishes KV events on the
*same* port numbers and the service dials ``tcp://<engine ip>:<socketPort>``. A port shared by
several IPs is therefore checked on every one of them.

Ports are found by binding port 0 and releasing it, so another process may take one before its
user binds it; :class:`PortAllocator` at least never hands out the same port twice.
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Iterable, Sequence

from ppc_extproc_lab.localcluster._errors import LocalClusterError

__all__ = [
    "ANY_ADDRESS",
    "PortAllocator",
    "check_loopback_ip",
    "free_port",
    "is_port_free",
    "loopback_ips",
]

#: Pseudo-address meaning "every interface": a port free on it is free on every address.
ANY_ADDRESS = "0.0.0.0"


def loopback_ips(count: int, *, first: int = 2) -> list[str]:
    """``count`` consecutive loopback IPs starting at ``127.0.0.<first>`` (spilling into 127.0.1.x …)."""
    if count < 0:
        raise ValueError("count must be >= 0")
    if first < 1:
        raise ValueError("first must be >= 1 (127.0.0.0 is not a host address)")
    if first + count > 0xFFFFFF:  # 127.255.255.255 is the broadcast address
        raise ValueError(f"too many loopback addresses requested ({count} from {first})")
    return [f"127.{n >> 16 & 255}.{n >> 8 & 255}.{n & 255}" for n in range(first, first + count)]


def check_loopback_ip(ip: str) -> None:
    """Raise :class:`LocalClusterError` if this host cannot bind ``ip`` (e.g. 127.0.0.2 on macOS)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((ip, 0))
        except OSError as exc:
            raise LocalClusterError(
                f"cannot bind {ip}: {exc}. The local cluster gives each engine its own loopback "
                "address; Linux routes all of 127.0.0.0/8, other systems need an alias "
                f"(macOS: sudo ifconfig lo0 alias {ip})"
            ) from exc


def _bind_probe(host: str, port: int) -> int:
    """Bind ``host:port`` like a server would (``SO_REUSEADDR``) and return the bound port."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host.strip("[]"), port))
        return int(sock.getsockname()[1])


def is_port_free(host: str, port: int) -> bool:
    """True if a server could bind ``host:port`` right now."""
    try:
        _bind_probe(host, port)
    except OSError as exc:
        if exc.errno in (errno.EADDRINUSE, errno.EACCES):
            return False
        raise
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port the kernel considers free on ``host`` (bound to port 0, then released)."""
    return _bind_probe(host, 0)


class PortAllocator:
    """Hands out distinct free ports, each free on every address it is meant for."""

    def __init__(self, *, attempts: int = 200) -> None:
        self._given: set[int] = set()
        self._attempts = attempts

    @property
    def allocated(self) -> frozenset[int]:
        """Every port handed out so far."""
        return frozenset(self._given)

    def port(self, hosts: Sequence[str] | str = "127.0.0.1") -> int:
        """A port not handed out before and free on every address in ``hosts``."""
        host_list = [hosts] if isinstance(hosts, str) else list(hosts)
        if not host_list:
            raise ValueError("hosts must not be empty")
        for _ in range(self._attempts):
            candidate = free_port(host_list[0])
            if candidate in self._given:
                continue
            if all(is_port_free(h, candidate) for h in host_list[1:]):
                self._given.add(candidate)
                return candidate
        raise LocalClusterError(
            f"no port free on all of {host_list} after {self._attempts} attempts"
        )

    def ports(self, count: int, hosts: Sequence[str] | str = "127.0.0.1") -> list[int]:
        """``count`` distinct ports, each free on every address in ``hosts``."""
        return [self.port(hosts) for _ in range(count)]

    def release(self, ports: Iterable[int]) -> None:
        """Forget ports so they may be handed out again."""
        self._given.difference_update(ports)
