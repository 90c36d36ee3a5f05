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
  engines' ports. With ``service_replicas=N`` there are N such processes (replica ``r`` on
  ``grpc_ports[r]`` / ``service_admin_ports[r]``, same config): each subscribes to every engine's
  KV events and routes the requests Envoy gives it;
* Envoy listens on ``127.0.0.1:<listener_port>`` (admin ``<envoy_admin_port>``), with one of the
  shipped configs rewritten by :mod:`ppc_extproc_lab.localcluster.envoy_config`; its ``ext_proc``
  cluster lists every replica, and Envoy load-balances the gRPC streams (one per request) over them.

P/D (``roles=[...]``, one per engine, see :mod:`~ppc_extproc_lab.localcluster.pd`): a
``"decode"`` engine is a pod of a sidecar on ``<ip>:<engine_port>`` and the mock on
``<ip>:<decoder_port>``; every engine is listed with its ``llm-d.ai/role`` label in an endpoints
file the service reads with ``file-discovery``.

Start order: engines (``GET /health`` 200, then their sidecars) → service replicas (gRPC health ``readiness``
SERVING, each) → Envoy (admin ``/ready`` 200). A failing start stops what was started and raises
:class:`ReadinessError` with the log tail; stop order is the reverse.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import structlog
import yaml

from ppc_extproc_lab.localcluster._errors import LocalClusterError
from ppc_extproc_lab.localcluster.envoy_config import DEFAULT_VARIANT, find_envoy, render_envoy_config
from ppc_extproc_lab.localcluster.layout import ClusterLayout
from ppc_extproc_lab.localcluster.pd import sidecar_argv, with_file_discovery, write_endpoints
from ppc_extproc_lab.localcluster.processes import ManagedProcess, ProcessGroup
from ppc_extproc_lab.localcluster.readiness import wait_for_grpc_health, wait_for_http
from ppc_extproc_lab.localcluster.service_config import default_service_config, patch_service_config

__all__ = ["DEFAULT_ENGINE_COMMAND", "DEFAULT_SERVICE_COMMAND", "LocalCluster"]

log = structlog.get_logger(__name__)

DEFAULT_ENGINE_COMMAND: tuple[str, ...] = (sys.executable, "-m", "ppc_extproc", "mock-vllm")
DEFAULT_SERVICE_COMMAND: tuple[str, ...] = (sys.executable, "-m", "ppc_extproc", "serve")


class LocalCluster(ClusterLayout):
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
        engines_per_process: engines served by one mock process (``--count k --distinct-hosts``:
            each still has its own loopback address, ports, cache and KV-event socket); 1 starts a
            process per engine. Above 1, engines cannot be stopped or restarted one at a time.
        service_args: extra arguments for the service (every replica).
        service_replicas: service processes behind Envoy's ``ext_proc`` cluster (same config,
            their own ports); replica 0 is what the single-service accessors refer to.
        service_config: the service config as a mapping or a YAML file path; the cluster patches
            the KV-event ports in, writes it to the log dir and passes ``--config-file``.
            ``None`` → :func:`default_service_config`.
        envoy_variant: ``"buffered"`` (``envoy.yaml``), ``"full-duplex"``, ``"override-host"`` or a YAML path.
        log_dir: where logs and rendered configs go; ``None`` → a temporary directory, removed on
            stop unless ``keep_logs`` or the start failed.
        engine_command / service_command: command prefixes (defaults: ``python -m ppc_extproc
            mock-vllm`` / ``serve``); the cluster appends the standard flags. For stand-ins.
        envoy_binary: Envoy executable (default :func:`find_envoy`).
        with_envoy: start Envoy (``False`` for service-only runs).
        with_service: start the service replicas (``False`` for engines-only runs, e.g. when
            another router or a client-side oracle sits in front of the engines; implies no Envoy).
        env: extra environment variables for every process.
        startup_timeout: seconds each process may take to become ready.
        stop_timeout: seconds between SIGTERM and SIGKILL.
        service_health_service: gRPC health service name that must be SERVING.
        replay: give engines a replay endpoint and set ``replaySocketPort``.
        ext_proc_tls: run the service with ``--secure-serving`` (TLS with a self-signed certificate)
            and keep the shipped Envoy file's TLS to it; by default both are plaintext.
        tokenizer: a HF model directory: the engines tokenize text, chat and messages with it
            (``--tokenizer``) and the service config gains a local ``token-producer`` on it (unless
            it has a token producer), so chat traffic is routed by the engines' own token ids.
        roles: one P/D role per engine (``""``, ``"prefill"``, ``"decode"``, ``"both"``,
            ``"prefill-decode"``): labels in file discovery, and a sidecar in front of each
            ``"decode"`` engine. ``None``: no labels, ``--endpoints`` as before.
        kv_connector / sidecar_args: the sidecars' ``--kv-connector`` and extra flags.
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
        engines_per_process: int = 1,
        service_args: Sequence[str] = (),
        service_replicas: int = 1,
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
        with_service: bool = True,
        env: Mapping[str, str] | None = None,
        startup_timeout: float = 60.0,
        stop_timeout: float = 10.0,
        first_engine_ip: int = 2,
        service_health_service: str = "readiness",
        replay: bool = True,
        tokenizer: str | os.PathLike[str] | None = None,
        ext_proc_tls: bool = False,
        roles: Sequence[str] | None = None,
        kv_connector: str = "nixlv2",
        sidecar_args: Sequence[str] = (),
    ) -> None:
        super().__init__(
            num_engines, service_replicas=service_replicas, first_engine_ip=first_engine_ip, roles=roles
        )
        if per_engine_args is not None and len(per_engine_args) != num_engines:
            raise ValueError("per_engine_args needs one entry per engine")
        if engines_per_process < 1:
            raise ValueError("engines_per_process must be >= 1")
        if engines_per_process > 1 and per_engine_args is not None:
            raise ValueError("per_engine_args needs one process per engine (engines_per_process=1)")
        self.engines_per_process = engines_per_process
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
        self.with_service = with_service
        self.with_envoy = with_envoy and with_service
        self.env = {"PYTHONUNBUFFERED": "1", **(env or {})}
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self.service_health_service = service_health_service
        self.replay = replay
        self.tokenizer = str(tokenizer) if tokenizer is not None else None
        self.ext_proc_tls = ext_proc_tls
        if self.roles is not None and "decode" in self.roles and engines_per_process > 1:
            raise ValueError("decode engines need one process each (engines_per_process=1)")
        self.kv_connector = kv_connector
        self.sidecar_args = list(sidecar_args)
        self._sidecars: dict[int, ManagedProcess] = {}
        self.endpoints_path: Path | None = None

        self._requested_log_dir = Path(log_dir) if log_dir is not None else None
        self._owns_log_dir = False
        self._failed_start = False
        self.log_dir: Path = Path()
        self._group: ProcessGroup | None = None
        self._engines: list[ManagedProcess] = []
        self._services: list[ManagedProcess] = []
        self._envoy: ManagedProcess | None = None
        self.service_config_path: Path | None = None
        self.envoy_config_path: Path | None = None

    # -- processes ---------------------------------------------------------------------------

    @property
    def engine_processes(self) -> list[ManagedProcess]:
        return list(self._engines)

    @property
    def sidecar_processes(self) -> dict[int, ManagedProcess]:
        """The sidecar of each decode engine, by engine index."""
        return dict(self._sidecars)

    @property
    def service_processes(self) -> list[ManagedProcess]:
        """Every service replica, in replica order (empty before :meth:`start`)."""
        return list(self._services)

    @property
    def service_process(self) -> ManagedProcess | None:
        """Replica 0."""
        return self._services[0] if self._services else None

    @property
    def envoy_process(self) -> ManagedProcess | None:
        return self._envoy

    def describe(self) -> dict[str, Any]:
        """Addresses and files of this run, for printing."""
        return {
            "listener_url": self.listener_url,
            "envoy_admin_url": self.envoy_admin_url if self.with_envoy else None,
            "grpc_targets": self.grpc_targets,
            "service_admin_urls": self.service_admin_urls,
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
            self.allocate_ports()
            self._write_configs()
            per = self.engines_per_process
            self._engines = [
                self._group.add(self._engine_process(i, min(per, self.num_engines - i)))
                for i in range(0, self.num_engines, per)
            ]
            for proc in self._engines:  # start all, then wait: they boot in parallel
                proc.start()
            for i in range(self.num_engines):
                self._wait_engine(i)
            for i in self.indices("decode"):
                self._sidecars[i] = self._group.add(self._sidecar_process(i))
                self._sidecars[i].start()
            for i in self._sidecars:
                wait_for_http(f"{self.engine_urls[i]}/health", timeout=self.startup_timeout, process=self._sidecars[i])
            if self.with_service:
                self._services = [
                    self._group.add(self._service_process(r))
                    for r in range(self.service_replicas)
                ]
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

    def _replicas(self, index: int | None) -> list[int]:
        if not self._services:
            raise LocalClusterError("cluster not started")
        if index is None:
            return list(range(len(self._services)))
        if not 0 <= index < len(self._services):
            raise IndexError(f"no service replica {index} (have {len(self._services)})")
        return [index]

    def stop_service(self, index: int | None = None) -> None:
        """Stop every service replica, or replica ``index`` (Envoy and engines keep running):
        the "EPP down" scenario."""
        if not self._services:
            return
        for r in self._replicas(index):
            self._services[r].stop(self.stop_timeout)

    def start_service(self, index: int | None = None) -> None:
        """(Re)start every replica not running (or replica ``index``); wait until each one's
        gRPC health reports SERVING."""
        replicas = self._replicas(index)
        for r in replicas:  # start all, then wait: they boot in parallel
            if not self._services[r].running():
                self._services[r].start()
        for r in replicas:
            wait_for_grpc_health(
                self.grpc_targets[r],
                self.service_health_service,
                timeout=self.startup_timeout,
                process=self._services[r],
                tls=self.ext_proc_tls,
            )

    def _single_engine(self, index: int) -> ManagedProcess:
        if self.engines_per_process > 1:
            raise LocalClusterError("engines share processes (engines_per_process > 1): stop or start them together")
        return self._engines[index]

    def stop_engine(self, index: int) -> None:
        """Stop engine ``index``."""
        self._single_engine(index).stop(self.stop_timeout)

    def kill_engine(self, index: int) -> None:
        """SIGKILL engine ``index`` (a crash: no graceful shutdown, sockets reset)."""
        self._engines[index].stop(self.stop_timeout, sig=signal.SIGKILL)

    def start_engine(self, index: int) -> None:
        """(Re)start engine ``index`` on the same address and ports; wait for ``/health``."""
        self._single_engine(index).start()
        self._wait_engine(index)

    def restart_engine(self, index: int) -> None:
        """Stop and start engine ``index`` (an engine restart: its KV cache and event sequence reset)."""
        self.stop_engine(index)
        self.start_engine(index)

    # -- internals ---------------------------------------------------------------------------

    def _prepare_log_dir(self) -> None:
        if self._requested_log_dir is None:
            self.log_dir = Path(tempfile.mkdtemp(prefix="ppc-localcluster-"))
            self._owns_log_dir = True
        else:
            self.log_dir = self._requested_log_dir
            self.log_dir.mkdir(parents=True, exist_ok=True)

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
            tokenizer=self.tokenizer,
        )
        if self.roles is not None:
            self.endpoints_path = write_endpoints(
                self.log_dir / "endpoints.yaml", self.engine_ips, self.engine_port, self.roles
            )
            patched = with_file_discovery(patched, self.endpoints_path)
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
                ext_proc_endpoints=self.grpc_targets,
                upstream_endpoints=self.engine_endpoints,
                ext_proc_tls=self.ext_proc_tls,
            )

    def _engine_process(self, index: int, count: int = 1) -> ManagedProcess:
        """The process of engine ``index`` (and, with ``count`` > 1, the next ``count - 1``)."""
        ip = self.engine_ips[index]
        decode = self.role(index) == "decode"
        argv = [
            *self.engine_command,
            "--host", ip,
            "--port", str(self.decoder_port if decode else self.engine_port),
            "--model", self.model,
            "--kv-events-endpoint", f"tcp://{ip}:{self.kv_events_port}",
        ]  # fmt: skip
        if decode:  # the pod's endpoint is the sidecar's: so are the topic and endpoint header
            argv += ["--advertise-port", str(self.engine_port)]
        if count > 1:
            argv += ["--count", str(count), "--distinct-hosts"]
        if self.replay:
            argv += ["--replay-endpoint", f"tcp://{ip}:{self.replay_port}"]
        if self.block_size is not None:
            argv += ["--block-size", str(self.block_size)]
        if self.num_blocks is not None:
            argv += ["--num-blocks", str(self.num_blocks)]
        if self.tokenizer is not None:
            argv += ["--tokenizer", self.tokenizer]
        argv += self.engine_args
        if self.per_engine_args is not None:
            argv += self.per_engine_args[index]
        name = f"engine-{index}" if count == 1 else f"engines-{index}-{index + count - 1}"
        return ManagedProcess(name, argv, log_path=self.log_dir / f"{name}.log", env=self.env)

    def _sidecar_process(self, index: int) -> ManagedProcess:
        argv = sidecar_argv(
            self.engine_ips[index], self.engine_port, self.decoder_port,
            kv_connector=self.kv_connector, extra=self.sidecar_args,
        )  # fmt: skip
        name = f"sidecar-{index}"
        return ManagedProcess(name, argv, log_path=self.log_dir / f"{name}.log", env=self.env)

    def _wait_engine(self, index: int) -> None:
        wait_for_http(
            f"{self.mock_urls[index]}/health",
            timeout=self.startup_timeout,
            process=self._engines[index // self.engines_per_process],
        )

    def _service_process(self, replica: int = 0) -> ManagedProcess:
        # With roles, the endpoints (and their labels) come from the config's file discovery.
        endpoints = ["--endpoints", ",".join(self.engine_endpoints)] if self.roles is None else []
        argv = [
            *self.service_command,
            "--grpc-port", str(self.grpc_ports[replica]),
            "--admin-port", str(self.service_admin_ports[replica]),
            "--admin-address", "127.0.0.1",
            *endpoints,
            "--config-file", str(self.service_config_path),
            *(["--secure-serving"] if self.ext_proc_tls else []),
            *self.service_args,
        ]  # fmt: skip
        # One replica keeps the historical name ("service", service.log).
        name = "service" if self.service_replicas == 1 else f"service-{replica}"
        return ManagedProcess(name, argv, log_path=self.log_dir / f"{name}.log", env=self.env)

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
