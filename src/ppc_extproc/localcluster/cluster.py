"""``LocalCluster``: Envoy, mock vLLM engines and ppc-extproc on loopback, always cleaned up.

::

    with LocalCluster(num_engines=3) as cluster:
        httpx.post(cluster.listener_url + "/v1/completions", json={...})

Layout of a run (ports chosen at start, all on loopback):

* engine ``i`` serves HTTP on ``127.0.0.<2+i>:<engine_port>`` and publishes KV events on
  ``tcp://127.0.0.<2+i>:<kv_events_port>`` (replay on ``<replay_port>``) — the same ports on every
  engine, like pods;
* the service serves gRPC (ext_proc + health) on ``127.0.0.1:<grpc_port>`` and its admin HTTP
  on ``127.0.0.1:<service_admin_port>``; its config file points the KV-event subscribers at the
  engines' ports;
* Envoy listens on ``127.0.0.1:<listener_port>`` (admin ``<envoy_admin_port>``), with one of the
  shipped configs rewritten by :mod:`ppc_extproc.localcluster.envoy_config`.

Start order: engines (``GET /health`` 200) → service (gRPC health ``readiness`` SERVING) → Envoy
(admin ``/ready`` 200). A failing start stops what was started and raises
:class:`ReadinessError` with the log tail; stop order is the reverse.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import structlog
import yaml

from ppc_extproc.localcluster._errors import LocalClusterError
from ppc_extproc.localcluster.envoy_config import DEFAULT_VARIANT, find_envoy, render_envoy_config
from ppc_extproc.localcluster.ports import (
    ANY_ADDRESS,
    PortAllocator,
    check_loopback_ip,
    loopback_ips,
)
from ppc_extproc.localcluster.processes import (
    ManagedProcess,
    ProcessGroup,
    wait_for_grpc_health,
    wait_for_http,
)
from ppc_extproc.localcluster.service_config import default_service_config, patch_service_config

__all__ = ["DEFAULT_ENGINE_COMMAND", "DEFAULT_SERVICE_COMMAND", "LocalCluster"]

log = structlog.get_logger(__name__)

DEFAULT_ENGINE_COMMAND: tuple[str, ...] = (sys.executable, "-m", "ppc_extproc", "mock-vllm")
DEFAULT_SERVICE_COMMAND: tuple[str, ...] = (sys.executable, "-m", "ppc_extproc", "serve")


class LocalCluster:
    """Engines + service + Envoy on loopback; a context manager that always stops everything.

    Args:
        num_engines: mock engines to start (IPs ``127.0.0.<first_engine_ip + i>``).
        model: ``--model`` of every engine (the served model name in the KV-event topic).
        block_size: passed as ``--block-size`` to the engines and written to the service config
            (``tokenProcessorConfig.blockSizeTokens``); ``None`` leaves both at their defaults.
        num_blocks: passed as ``--num-blocks`` (KV blocks per engine) when given.
        engine_args: extra arguments for every engine, e.g. the time model
            (``--prefill-tokens-per-s``, ``--decode-ms-per-token``, ``--max-num-seqs``).
        per_engine_args: extra arguments per engine (index ``i`` → engine ``i``).
        service_args: extra arguments for the service.
        service_config: the service config as a mapping or a YAML file path; the cluster patches
            the KV-event ports in, writes it to the log dir and passes ``--config-file``.
            ``None`` → :func:`default_service_config`.
        envoy_variant: ``"full-duplex"``, ``"buffered"``, ``"override-host"`` or a YAML path.
        log_dir: where logs and rendered configs go; ``None`` → a temporary directory, removed on
            stop unless ``keep_logs`` or the start failed.
        engine_command / service_command: command prefixes (defaults: ``python -m ppc_extproc
            mock-vllm`` / ``serve``); the cluster appends the standard flags. For stand-ins.
        envoy_binary: Envoy executable (default :func:`find_envoy`).
        with_envoy: start Envoy (``False`` for service-only runs).
        env: extra environment variables for every process.
        startup_timeout: seconds each process may take to become ready.
        stop_timeout: seconds between SIGTERM and SIGKILL.
        service_health_service: gRPC health service name that must be SERVING.
        replay: give engines a replay endpoint and set ``replaySocketPort``.
    """

    def __init__(
        self,
        *,
        num_engines: int = 2,
        model: str = "mock-model",
        block_size: int | None = None,
        num_blocks: int | None = None,
        engine_args: Sequence[str] = (),
        per_engine_args: Sequence[Sequence[str]] | None = None,
        service_args: Sequence[str] = (),
        service_config: Mapping[str, Any] | str | os.PathLike[str] | None = None,
        envoy_variant: str | os.PathLike[str] = DEFAULT_VARIANT,
        log_dir: str | os.PathLike[str] | None = None,
        keep_logs: bool = False,
        engine_command: Sequence[str] | None = None,
        service_command: Sequence[str] | None = None,
        envoy_binary: str | None = None,
        envoy_args: Sequence[str] = (),
        envoy_log_level: str = "warn",
        with_envoy: bool = True,
        env: Mapping[str, str] | None = None,
        startup_timeout: float = 60.0,
        stop_timeout: float = 10.0,
        first_engine_ip: int = 2,
        service_health_service: str = "readiness",
        replay: bool = True,
    ) -> None:
        if num_engines < 0:
            raise ValueError("num_engines must be >= 0")
        if per_engine_args is not None and len(per_engine_args) != num_engines:
            raise ValueError("per_engine_args needs one entry per engine")
        self.num_engines = num_engines
        self.model = model
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.engine_args = list(engine_args)
        self.per_engine_args = (
            [list(a) for a in per_engine_args] if per_engine_args is not None else None
        )
        self.service_args = list(service_args)
        self.service_config = service_config
        self.envoy_variant = envoy_variant
        self.keep_logs = keep_logs
        self.engine_command = list(engine_command or DEFAULT_ENGINE_COMMAND)
        self.service_command = list(service_command or DEFAULT_SERVICE_COMMAND)
        self.envoy_binary = envoy_binary
        self.envoy_args = list(envoy_args)
        self.envoy_log_level = envoy_log_level
        self.with_envoy = with_envoy
        self.env = {"PYTHONUNBUFFERED": "1", **(env or {})}
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self.service_health_service = service_health_service
        self.replay = replay

        self.engine_ips: list[str] = loopback_ips(num_engines, first=first_engine_ip)
        self._requested_log_dir = Path(log_dir) if log_dir is not None else None
        self._owns_log_dir = False
        self._failed_start = False
        self.log_dir: Path = Path()
        self._group: ProcessGroup | None = None
        self._engines: list[ManagedProcess] = []
        self._service: ManagedProcess | None = None
        self._envoy: ManagedProcess | None = None
        self.engine_port = self.kv_events_port = self.replay_port = 0
        self.grpc_port = self.service_admin_port = self.listener_port = self.envoy_admin_port = 0
        self.service_config_path: Path | None = None
        self.envoy_config_path: Path | None = None

    # -- addresses ---------------------------------------------------------------------------

    @property
    def engine_endpoints(self) -> list[str]:
        """``ip:port`` of every engine, in index order (the service's ``--endpoints``)."""
        return [f"{ip}:{self.engine_port}" for ip in self.engine_ips]

    @property
    def engine_urls(self) -> list[str]:
        """``http://ip:port`` of every engine."""
        return [f"http://{e}" for e in self.engine_endpoints]

    @property
    def kv_events_endpoints(self) -> list[str]:
        """``tcp://ip:port`` each engine publishes KV events on."""
        return [f"tcp://{ip}:{self.kv_events_port}" for ip in self.engine_ips]

    @property
    def listener_url(self) -> str:
        """Envoy's listener: where clients send requests."""
        return f"http://127.0.0.1:{self.listener_port}"

    @property
    def envoy_admin_url(self) -> str:
        """Envoy's admin interface (``/ready``, ``/stats``, ``/clusters``)."""
        return f"http://127.0.0.1:{self.envoy_admin_port}"

    @property
    def service_admin_url(self) -> str:
        """The service's admin HTTP server (``/readyz``, ``/metrics``)."""
        return f"http://127.0.0.1:{self.service_admin_port}"

    @property
    def admin_url(self) -> str:
        """Same as :attr:`service_admin_url`."""
        return self.service_admin_url

    @property
    def grpc_target(self) -> str:
        """``host:port`` of the service's gRPC server (ext_proc and health)."""
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def engine_processes(self) -> list[ManagedProcess]:
        return list(self._engines)

    @property
    def service_process(self) -> ManagedProcess | None:
        return self._service

    @property
    def envoy_process(self) -> ManagedProcess | None:
        return self._envoy

    def describe(self) -> dict[str, Any]:
        """Addresses and files of this run, for printing."""
        return {
            "listener_url": self.listener_url,
            "envoy_admin_url": self.envoy_admin_url if self.with_envoy else None,
            "grpc_target": self.grpc_target,
            "service_admin_url": self.service_admin_url,
            "engine_endpoints": self.engine_endpoints,
            "kv_events_endpoints": self.kv_events_endpoints,
            "envoy_config": str(self.envoy_config_path) if self.envoy_config_path else None,
            "service_config": str(self.service_config_path) if self.service_config_path else None,
            "log_dir": str(self.log_dir),
        }

    # -- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Allocate ports, write configs, start engines → service → Envoy, wait for readiness."""
        if self._group is not None:
            raise LocalClusterError("cluster already started")
        self._prepare_log_dir()
        self._group = ProcessGroup(self.log_dir, stop_timeout=self.stop_timeout)
        try:
            self._allocate_ports()
            self._write_configs()
            self._engines = [
                self._group.add(self._engine_process(i)) for i in range(self.num_engines)
            ]
            for proc in self._engines:  # start all, then wait: they boot in parallel
                proc.start()
            for i in range(self.num_engines):
                self._wait_engine(i)
            self._service = self._group.add(self._service_process())
            self.start_service()
            if self.with_envoy:
                self._envoy = self._group.add(self._envoy_process())
                self._envoy.start()
                wait_for_http(
                    f"{self.envoy_admin_url}/ready",
                    timeout=self.startup_timeout,
                    process=self._envoy,
                )
        except BaseException:
            self._failed_start = True  # keep the logs the error message points to
            self.stop()
            raise
        log.info("local_cluster_started", **self.describe())

    def stop(self) -> None:
        """Stop Envoy, the service and the engines (in that order); idempotent."""
        group, self._group = self._group, None
        try:
            if group is not None:
                group.stop_all()
        finally:
            if self._owns_log_dir and not (self.keep_logs or self._failed_start):
                shutil.rmtree(self.log_dir, ignore_errors=True)
                self._owns_log_dir = False

    def stop_service(self) -> None:
        """Stop the service (Envoy and engines keep running): the "EPP down" scenario."""
        if self._service is not None:
            self._service.stop(self.stop_timeout)

    def start_service(self) -> None:
        """(Re)start the service and wait until its gRPC health reports SERVING."""
        if self._service is None:
            raise LocalClusterError("cluster not started")
        self._service.start()
        wait_for_grpc_health(
            self.grpc_target,
            self.service_health_service,
            timeout=self.startup_timeout,
            process=self._service,
        )

    def stop_engine(self, index: int) -> None:
        """Stop engine ``index``."""
        self._engines[index].stop(self.stop_timeout)

    def start_engine(self, index: int) -> None:
        """(Re)start engine ``index`` on the same address and ports; wait for ``/health``."""
        self._engines[index].start()
        self._wait_engine(index)

    def restart_engine(self, index: int) -> None:
        """Stop and start engine ``index`` (an engine restart: its KV cache and event sequence reset)."""
        self.stop_engine(index)
        self.start_engine(index)

    def log_tails(self, lines: int = 40) -> dict[str, str]:
        """The last lines of every process log, by process name."""
        procs = [*self._engines, self._service, self._envoy]
        return {p.name: p.log_tail(lines) for p in procs if p is not None}

    # -- internals ---------------------------------------------------------------------------

    def _prepare_log_dir(self) -> None:
        if self._requested_log_dir is None:
            self.log_dir = Path(tempfile.mkdtemp(prefix="ppc-localcluster-"))
            self._owns_log_dir = True
        else:
            self.log_dir = self._requested_log_dir
            self.log_dir.mkdir(parents=True, exist_ok=True)

    def _allocate_ports(self) -> None:
        for ip in self.engine_ips:
            check_loopback_ip(ip)
        ports = PortAllocator()
        engine_hosts = self.engine_ips or ["127.0.0.1"]
        self.engine_port, self.kv_events_port, self.replay_port = ports.ports(3, engine_hosts)
        # The service and Envoy may bind every interface: their ports must be free everywhere.
        self.grpc_port, self.service_admin_port, self.listener_port, self.envoy_admin_port = (
            ports.ports(4, ANY_ADDRESS)
        )

    def _write_configs(self) -> None:
        source: Mapping[str, Any]
        if self.service_config is None:
            source = default_service_config(block_size=self.block_size)
        elif isinstance(self.service_config, Mapping):
            source = self.service_config
        else:
            loaded = yaml.safe_load(Path(self.service_config).read_text(encoding="utf-8"))
            if not isinstance(loaded, dict):
                raise LocalClusterError(f"{self.service_config!s}: not a YAML mapping")
            source = loaded
        patched = patch_service_config(
            source,
            socket_port=self.kv_events_port,
            replay_socket_port=self.replay_port if self.replay else 0,
            block_size=self.block_size,
        )
        self.service_config_path = self.log_dir / "service-config.yaml"
        self.service_config_path.write_text(
            yaml.safe_dump(patched, sort_keys=False), encoding="utf-8"
        )
        if self.with_envoy:
            self.envoy_config_path = render_envoy_config(
                self.envoy_variant,
                self.log_dir,
                listener_port=self.listener_port,
                admin_port=self.envoy_admin_port,
                ext_proc_port=self.grpc_port,
                upstream_endpoints=self.engine_endpoints,
            )

    def _engine_process(self, index: int) -> ManagedProcess:
        ip = self.engine_ips[index]
        argv = [
            *self.engine_command,
            "--host", ip,
            "--port", str(self.engine_port),
            "--model", self.model,
            "--kv-events-endpoint", f"tcp://{ip}:{self.kv_events_port}",
        ]  # fmt: skip
        if self.replay:
            argv += ["--replay-endpoint", f"tcp://{ip}:{self.replay_port}"]
        if self.block_size is not None:
            argv += ["--block-size", str(self.block_size)]
        if self.num_blocks is not None:
            argv += ["--num-blocks", str(self.num_blocks)]
        argv += self.engine_args
        if self.per_engine_args is not None:
            argv += self.per_engine_args[index]
        return ManagedProcess(
            f"engine-{index}", argv, log_path=self.log_dir / f"engine-{index}.log", env=self.env
        )

    def _wait_engine(self, index: int) -> None:
        wait_for_http(
            f"{self.engine_urls[index]}/health",
            timeout=self.startup_timeout,
            process=self._engines[index],
        )

    def _service_process(self) -> ManagedProcess:
        argv = [
            *self.service_command,
            "--grpc-port", str(self.grpc_port),
            "--admin-port", str(self.service_admin_port),
            "--admin-address", "127.0.0.1",
            "--endpoints", ",".join(self.engine_endpoints),
            "--config-file", str(self.service_config_path),
            *self.service_args,
        ]  # fmt: skip
        return ManagedProcess("service", argv, log_path=self.log_dir / "service.log", env=self.env)

    def _envoy_process(self) -> ManagedProcess:
        argv = [
            self.envoy_binary or find_envoy(),
            "-c", str(self.envoy_config_path),
            # No hot restart ⇒ no shared-memory base id: any number of Envoys may run at once.
            "--disable-hot-restart",
            "--log-level", self.envoy_log_level,
            *self.envoy_args,
        ]  # fmt: skip
        return ManagedProcess("envoy", argv, log_path=self.log_dir / "envoy.log", env=self.env)
