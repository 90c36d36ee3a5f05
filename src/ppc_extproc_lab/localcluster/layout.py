"""Where every process of a local cluster listens: loopback IPs, ports, and the URLs built on them.

:class:`ClusterLayout` is the address book :class:`~ppc_extproc_lab.localcluster.LocalCluster` is
built on (it subclasses it): engine ``i`` on ``engine_ips[i]`` with ports shared by every engine,
service replica ``r`` on ``127.0.0.1:grpc_ports[r]`` (admin ``service_admin_ports[r]``), Envoy on
``listener_port`` / ``envoy_admin_port``. The single-service names (``grpc_port``,
``service_admin_url``, ``admin_url``, …) refer to replica 0. Nothing here starts a process.
"""

from __future__ import annotations

from collections.abc import Sequence

from ppc_extproc_lab.localcluster.pd import check_roles
from ppc_extproc_lab.localcluster.ports import (
    ANY_ADDRESS,
    PortAllocator,
    check_loopback_ip,
    loopback_ips,
)

__all__ = ["ClusterLayout"]


class ClusterLayout:
    """Addresses of ``num_engines`` engines, ``service_replicas`` services and one Envoy."""

    def __init__(
        self,
        num_engines: int,
        *,
        service_replicas: int = 1,
        first_engine_ip: int = 2,
        roles: Sequence[str] | None = None,
    ) -> None:
        if num_engines < 0:
            raise ValueError("num_engines must be >= 0")
        if service_replicas < 1:
            raise ValueError("service_replicas must be >= 1")
        self.num_engines = num_engines
        self.service_replicas = service_replicas
        self.engine_ips: list[str] = loopback_ips(num_engines, first=first_engine_ip)
        #: One P/D role per engine (``pd.ROLES``), or None: no roles.
        self.roles: list[str] | None = check_roles(roles, num_engines) if roles is not None else None
        self.engine_port = self.kv_events_port = self.replay_port = 0
        #: Where a decode pod's mock listens behind its sidecar (P/D clusters; 0 otherwise).
        self.decoder_port = 0
        self.listener_port = self.envoy_admin_port = 0
        #: gRPC and admin port of each service replica, in replica order.
        self.grpc_ports: list[int] = [0] * service_replicas
        self.service_admin_ports: list[int] = [0] * service_replicas

    def allocate_ports(self) -> None:
        """Check the engines' loopback IPs and pick free ports for everything."""
        for ip in self.engine_ips:
            check_loopback_ip(ip)
        ports = PortAllocator()
        engine_hosts = self.engine_ips or ["127.0.0.1"]
        self.engine_port, self.kv_events_port, self.replay_port, self.decoder_port = ports.ports(4, engine_hosts)
        # The services and Envoy may bind every interface: their ports must be free everywhere.
        self.grpc_ports = ports.ports(self.service_replicas, ANY_ADDRESS)
        self.service_admin_ports = ports.ports(self.service_replicas, ANY_ADDRESS)
        self.listener_port, self.envoy_admin_port = ports.ports(2, ANY_ADDRESS)

    # -- engines -----------------------------------------------------------------------------

    @property
    def engine_endpoints(self) -> list[str]:
        """``ip:port`` of every engine, in index order (the service's ``--endpoints``)."""
        return [f"{ip}:{self.engine_port}" for ip in self.engine_ips]

    def role(self, index: int) -> str:
        """Engine ``index``'s P/D role ("" when unlabeled)."""
        return self.roles[index] if self.roles is not None else ""

    def indices(self, role: str) -> list[int]:
        """The engines with ``role``."""
        return [i for i in range(self.num_engines) if self.role(i) == role]

    @property
    def mock_urls(self) -> list[str]:
        """``http://ip:port`` of each engine's mock itself (behind the sidecar in a decode pod):
        where ``/mock/state`` and ``/mock/requests`` are."""
        return [
            f"http://{ip}:{self.decoder_port if self.role(i) == 'decode' else self.engine_port}"
            for i, ip in enumerate(self.engine_ips)
        ]

    @property
    def engine_urls(self) -> list[str]:
        """``http://ip:port`` of every engine."""
        return [f"http://{e}" for e in self.engine_endpoints]

    @property
    def kv_events_endpoints(self) -> list[str]:
        """``tcp://ip:port`` each engine publishes KV events on."""
        return [f"tcp://{ip}:{self.kv_events_port}" for ip in self.engine_ips]

    # -- Envoy -------------------------------------------------------------------------------

    @property
    def listener_url(self) -> str:
        """Envoy's listener: where clients send requests."""
        return f"http://127.0.0.1:{self.listener_port}"

    @property
    def envoy_admin_url(self) -> str:
        """Envoy's admin interface (``/ready``, ``/stats``, ``/clusters``)."""
        return f"http://127.0.0.1:{self.envoy_admin_port}"

    # -- service replicas --------------------------------------------------------------------

    @property
    def grpc_targets(self) -> list[str]:
        """``host:port`` of every replica's gRPC server (ext_proc and health)."""
        return [f"127.0.0.1:{port}" for port in self.grpc_ports]

    @property
    def service_admin_urls(self) -> list[str]:
        """Every replica's admin HTTP server (``/readyz``, ``/metrics``, ``/debug/decisions``)."""
        return [f"http://127.0.0.1:{port}" for port in self.service_admin_ports]

    @property
    def grpc_port(self) -> int:
        """Replica 0's gRPC port."""
        return self.grpc_ports[0]

    @grpc_port.setter
    def grpc_port(self, port: int) -> None:
        self.grpc_ports[0] = port

    @property
    def service_admin_port(self) -> int:
        """Replica 0's admin port."""
        return self.service_admin_ports[0]

    @service_admin_port.setter
    def service_admin_port(self, port: int) -> None:
        self.service_admin_ports[0] = port

    @property
    def service_admin_url(self) -> str:
        """Replica 0's admin HTTP server."""
        return self.service_admin_urls[0]

    @property
    def admin_url(self) -> str:
        """Same as :attr:`service_admin_url` (replica 0)."""
        return self.service_admin_url
