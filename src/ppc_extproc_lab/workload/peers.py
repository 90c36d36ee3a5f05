"""Peer routers as routing policies: ``vllm-router`` and ``sglang-router`` in front of the engines.

Both are Rust HTTP routers with a Python launcher (PyPI wheels, the ``bench`` extra). Each
replica is started with the engines' URLs and its ``cache_aware`` policy (an approximate
per-worker radix tree of the request text it routed, plus shortest-queue when loads diverge;
``--cache-threshold 0.3``, ``--balance-abs-threshold 64``, ``--balance-rel-threshold 1.5`` by
default, ``--help`` of either). ``vllm-router-kv`` is vllm-router's precise ``kv_aware`` policy:
it subscribes to every engine's KV events (``--kv-event-source URL=tcp://…``, replay via
``--kv-event-replay-source``, ``--kv-event-block-size``, ``--kv-event-model``) and tokenises
text prompts through the worker (``/v1/completions/render``, then ``/tokenize``). Against the
mock it subscribes and tokenises, yet credits no cached prefix (its debug log shows
``credited_prefix_tokens=0`` on every decision, ``vllm_router_kv_placement_lookups_total
{result="miss"}``): not in the default line-up until that is understood. Every address is loopback: the routers' defaults bind
``0.0.0.0`` (sglang-router) and a Prometheus exporter on ``:29000`` (both), so host and metrics
port are always given. Flags beyond those are what working against the mock needs:

* ``--worker-startup-check-interval 1``: the engines are up before the router starts; the
  default (30 s) would make a router that looked too early wait half a minute.

What they ask of a worker (observed at the mock's door, see ``mock_vllm/peer_probes.py``):
``GET /health`` (readiness and periodic checks), ``GET /v1/models`` (vllm-router),
``/server_info``, ``/get_server_info``, ``/model_info``, ``/get_model_info`` (sglang-router, 404
like a vLLM), and per text request ``POST /v1/completions/render`` then ``POST /tokenize``
(vllm-router). sglang-router rejects token-id prompts (422: its ``prompt`` is a string or a list
of strings); vllm-router forwards them.

:class:`PeerDeployment` starts ``replicas`` processes on ports chosen at run time (with more
than one, an Envoy round-robin balancer in front, :mod:`~ppc_extproc_lab.localcluster.balancer`),
waits for each one's ``/readiness`` with a timeout, and stops everything it started.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Self

from ppc_extproc_lab.localcluster.balancer import start_balancer
from ppc_extproc_lab.localcluster.ports import PortAllocator
from ppc_extproc_lab.localcluster.processes import ManagedProcess, ProcessGroup
from ppc_extproc_lab.localcluster.readiness import wait_for_http

__all__ = ["PEERS", "KvEventSources", "PeerDeployment", "PeerRouter", "peer"]


@dataclass(frozen=True, slots=True)
class KvEventSources:
    """The engines' KV-event endpoints, for a peer policy that reads them (one per worker URL)."""

    endpoints: Sequence[str]
    replay_endpoints: Sequence[str]
    block_size: int
    model: str


@dataclass(frozen=True, slots=True)
class PeerRouter:
    """How to run one peer router."""

    name: str
    #: Command prefix (the console script, and a subcommand if any).
    command: tuple[str, ...]
    #: PyPI distribution (for the version in reports).
    distribution: str
    #: ``--log-level`` value that keeps per-request lines out of the log.
    quiet_log_level: str
    #: False when the router rejects token-id prompts.
    accepts_token_ids: bool
    policy: str = "cache_aware"
    #: The policy reads the engines' KV events (needs :class:`KvEventSources`).
    reads_kv_events: bool = False

    def argv(
        self, *, port: int, metrics_port: int, worker_urls: Sequence[str], kv: KvEventSources | None = None
    ) -> list[str]:
        """The command line of one replica."""
        argv = [
            *self.command,
            "--host", "127.0.0.1", "--port", str(port),
            "--worker-urls", *worker_urls,
            "--policy", self.policy,
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port),
            "--worker-startup-check-interval", "1",
            "--log-level", self.quiet_log_level,
        ]  # fmt: skip
        if self.reads_kv_events:
            if kv is None or len(kv.endpoints) != len(worker_urls):
                raise ValueError(f"{self.name} needs one KV-event endpoint per worker")
            for url, endpoint in zip(worker_urls, kv.endpoints):
                argv += ["--kv-event-source", f"{url}={endpoint}"]
            for url, endpoint in zip(worker_urls, kv.replay_endpoints):
                argv += ["--kv-event-replay-source", f"{url}={endpoint}"]
            argv += ["--kv-event-block-size", str(kv.block_size), "--kv-event-model", kv.model]
        return argv

    def available(self) -> bool:
        """Is the router's executable on ``PATH`` (or next to this interpreter)?"""
        return _executable(self.command[0]) is not None

    def version(self) -> str:
        try:
            return importlib.metadata.version(self.distribution)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"


PEERS: Mapping[str, PeerRouter] = {
    "vllm-router": PeerRouter("vllm-router", ("vllm-router",), "vllm-router", "warning", accepts_token_ids=True),
    "vllm-router-kv": PeerRouter(
        "vllm-router-kv", ("vllm-router",), "vllm-router", "warning", accepts_token_ids=True, policy="kv_aware",
        reads_kv_events=True,
    ),
    "sglang-router": PeerRouter(
        "sglang-router", ("sglang-router", "launch"), "sglang-router", "warn", accepts_token_ids=False
    ),
}


def peer(name: str) -> PeerRouter:
    """The peer router called ``name`` (a key of :data:`PEERS`)."""
    if name not in PEERS:
        raise ValueError(f"unknown peer router {name!r}; choose from {', '.join(PEERS)}")
    return PEERS[name]


def _executable(name: str) -> str | None:
    import sys

    return shutil.which(name, path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))


class PeerDeployment:
    """``replicas`` processes of ``router`` over ``worker_urls`` (a balancer in front of several).

    ``url`` is where clients send requests; ``processes`` lists every process started (for CPU
    accounting). A context manager: everything is stopped on exit, also after a failed start.
    """

    def __init__(
        self,
        router: PeerRouter,
        worker_urls: Sequence[str],
        *,
        log_dir: str | os.PathLike[str],
        replicas: int = 1,
        kv: KvEventSources | None = None,
        startup_timeout: float = 60.0,
        stop_timeout: float = 10.0,
        env: Mapping[str, str] | None = None,
    ) -> None:
        if replicas < 1:
            raise ValueError("replicas must be >= 1")
        if not worker_urls:
            raise ValueError("a peer router needs at least one worker")
        self.router = router
        self.worker_urls = list(worker_urls)
        self.replicas = replicas
        self.kv = kv
        self.startup_timeout = startup_timeout
        self.env = env
        self._group = ProcessGroup(log_dir, stop_timeout=stop_timeout)
        self.url = ""
        self.replica_urls: list[str] = []

    @property
    def processes(self) -> list[ManagedProcess]:
        return self._group.processes

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Start every replica (in parallel), wait until each is ready, then the balancer."""
        executable = _executable(self.router.command[0])
        if executable is None:
            raise FileNotFoundError(
                f"{self.router.command[0]} not found: pip install 'ppc-extproc[bench]' "
                f"({self.router.distribution} {self.router.version()})"
            )
        ports = PortAllocator()
        try:
            procs: list[ManagedProcess] = []
            for r in range(self.replicas):
                port, metrics = ports.ports(2, ["127.0.0.1"])
                argv = self.router.argv(port=port, metrics_port=metrics, worker_urls=self.worker_urls, kv=self.kv)
                argv[0] = executable
                procs.append(self._group.spawn(f"{self.router.name}-{r}", argv, env=self.env))
                self.replica_urls.append(f"http://127.0.0.1:{port}")
            for proc, url in zip(procs, self.replica_urls):
                wait_for_http(url + "/readiness", timeout=self.startup_timeout, process=proc)
            self.url = self.replica_urls[0]
            if self.replicas > 1:
                listener, admin = ports.ports(2, ["127.0.0.1"])
                upstreams = [u.removeprefix("http://") for u in self.replica_urls]
                start_balancer(self._group, upstreams, listener_port=listener, admin_port=admin,
                               timeout=self.startup_timeout, env=self.env)  # fmt: skip
                self.url = f"http://127.0.0.1:{listener}"
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop the balancer and every replica; idempotent."""
        self._group.stop_all()
