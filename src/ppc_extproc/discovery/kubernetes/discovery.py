"""Kubernetes discovery: an InferencePool (or a bare label selector) and its pods → the endpoint pool.

Pool mode (``--pool-name``) watches the InferencePool by name and the pods its
``spec.selector.matchLabels`` selects; selector mode (``--endpoint-selector`` with
``--endpoint-target-ports``) watches the selected pods with a fixed port list. Each serving pod gives
``podIP:targetPorts[i]`` with rank ``i`` (``pods.py``). Every change recomputes the full endpoint list
and hands it to ``pool.replace``, the one owner of endpoint lifecycle (adds start KV-event
subscribers; deletes close them and clear the endpoint's index entries), as file discovery does.

* The first ``pool.replace`` (which readiness waits for) happens only after the pool is known, a
  complete pod list is in and both watches have been accepted. Without that within ``sync_timeout_seconds`` ``run`` raises a
  ConfigError (the service exits, as llm-d's controllers do when their caches do not sync); a 403
  before then is fatal at once, naming the resource.
* A selector change restarts the pod list + watch with the new ``labelSelector``; until that list is
  in, the previous pods that match the new selector keep their endpoints. A ``targetPorts`` change
  only recomputes (the cache has every pod). A deleted (or deleting) pool clears every endpoint.
* A pod IP change is a delete of the old ``ip:port`` and an add of the new one. A pod recreated with
  the same name and IP (new uid) is first deleted, so the dead engine's index entries go.
* During an API-server outage the last endpoint set stays in force (llm-d's cache behaviour).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from ppc_extproc.discovery.kubernetes.auth import SERVICE_ACCOUNT_DIR, ClusterAccess, load_cluster_access
from ppc_extproc.discovery.kubernetes.client import ApiSession, ApiStatusError, Reflector, Resource, WatchTimings
from ppc_extproc.discovery.kubernetes.pods import PodRecord, parse_pod, pod_endpoints
from ppc_extproc.discovery.kubernetes.pool import POOL_GROUP_V1, POOL_VERSIONS, PoolSpec, parse_inference_pool
from ppc_extproc.discovery.kubernetes.selector import LabelSelector
from ppc_extproc.errors import ConfigError
from ppc_extproc.framework import Discovery, Endpoint, EndpointRegistry
from ppc_extproc.ids import EndpointId

__all__ = ["KubernetesDiscovery", "KubernetesDiscoveryConfig"]

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class KubernetesDiscoveryConfig:
    """What to watch. Exactly one of ``pool_name`` and ``endpoint_selector`` is set."""

    namespace: str
    #: Pool mode: the InferencePool's name (``--pool-name``).
    pool_name: str = ""
    #: The InferencePool's API group (``--pool-group``); v1 and the removed v1alpha2 are read.
    pool_group: str = POOL_GROUP_V1
    #: Selector mode (``--endpoint-selector``).
    endpoint_selector: LabelSelector | None = None
    #: Selector mode: ranks' ports, in order (``--endpoint-target-ports``).
    target_ports: tuple[int, ...] = ()
    #: ``--kubeconfig``; None: ``$KUBECONFIG``, in-cluster, ``~/.kube/config``.
    kubeconfig: str | None = None
    sync_timeout_seconds: float = 120.0
    max_pods: int = 10_000
    max_endpoints: int = 4096
    timings: WatchTimings = field(default_factory=WatchTimings)

    def __post_init__(self) -> None:
        if bool(self.pool_name) == (self.endpoint_selector is not None):
            raise ConfigError("--pool-name", "either pool-name or endpoint-selector must be set")
        if self.endpoint_selector is not None and not self.target_ports:
            raise ConfigError("--endpoint-target-ports", "required with --endpoint-selector")
        if self.pool_group not in POOL_VERSIONS:
            raise ConfigError("--pool-group", f"must be one of {', '.join(POOL_VERSIONS)}; got {self.pool_group!r}")

    def describe(self) -> str:
        if self.pool_name:
            return f"InferencePool {self.namespace}/{self.pool_name} ({self.pool_group})"
        return f"pods {self.endpoint_selector} in {self.namespace}, ports {list(self.target_ports)}"


def _pool_record(group: str) -> Any:
    def parse(obj: Mapping[str, Any]) -> PoolSpec:
        return parse_inference_pool(obj, group)
    return parse


class KubernetesDiscovery(Discovery):
    """Endpoint discovery fed by the Kubernetes API (an InferencePool and its pods, or a selector)."""

    name = "kubernetes"
    type_name = "kubernetes"

    def __init__(self, config: KubernetesDiscoveryConfig, *, access: ClusterAccess | None = None,
                 environ: Mapping[str, str] | None = None, service_account_dir: Path = SERVICE_ACCOUNT_DIR) -> None:
        self.config = config
        self._access = access
        self._environ = os.environ if environ is None else environ
        self._service_account_dir = service_account_dir
        self._changed = asyncio.Event()
        self._pool_reflector: Reflector[PoolSpec] | None = None
        self._pods: Reflector[PodRecord] | None = None
        self._previous_pods: dict[str, PodRecord] = {}
        self._pods_task: asyncio.Task[None] | None = None
        self._applied: dict[EndpointId, tuple[Endpoint, str]] = {}
        self.synced = False

    @property
    def reflectors(self) -> list[Reflector[Any]]:
        """The running list+watch loops (pool first, then pods): their ``synced``, ``last_error``."""
        return [r for r in (self._pool_reflector, self._pods) if r is not None]

    # -- state → endpoints ---------------------------------------------------------------------

    def current_spec(self) -> PoolSpec | None:
        """The spec in force: the watched pool's (None while unknown, deleted or deleting), or the
        flags' in selector mode."""
        config = self.config
        if config.endpoint_selector is not None:
            return PoolSpec(config.namespace, "", config.endpoint_selector, config.target_ports)
        assert self._pool_reflector is not None
        spec = self._pool_reflector.objects.get(config.pool_name)
        return None if spec is None or spec.deleting else spec

    def endpoints_for(self, spec: PoolSpec, pods: Iterable[PodRecord]) -> list[tuple[Endpoint, str]]:
        """(endpoint, pod uid) for every serving pod the selector matches, by pod name, capped."""
        out: list[tuple[Endpoint, str]] = []
        seen: set[EndpointId] = set()
        for pod in sorted(pods, key=lambda p: p.name):
            if not spec.selector.matches(pod.label_map()):
                continue
            for endpoint in pod_endpoints(pod, spec.target_ports):
                if endpoint.id in seen:
                    log.warning("kubernetes_endpoint_duplicate", endpoint=endpoint.id, pod=pod.name)
                    continue
                if len(out) >= self.config.max_endpoints:
                    log.error("kubernetes_endpoint_cap_reached", cap=self.config.max_endpoints)
                    return out
                seen.add(endpoint.id)
                out.append((endpoint, pod.uid))
        return out

    def _apply(self, pool: EndpointRegistry, endpoints: list[tuple[Endpoint, str]]) -> None:
        recreated = {e.id for e, uid in endpoints if e.id in self._applied and self._applied[e.id][1] != uid}
        if recreated:  # same ip:port, new pod: delete first so the old engine's index entries go
            pool.replace([e for eid, (e, _) in self._applied.items() if eid not in recreated])
        pool.replace([e for e, _ in endpoints])
        self._applied = {e.id: (e, uid) for e, uid in endpoints}

    # -- reflectors ----------------------------------------------------------------------------

    def _notify(self) -> None:
        self._changed.set()

    def _start_pods(self, session: ApiSession, selector: LabelSelector) -> None:
        if self._pods is not None:
            self._previous_pods = self._pods.objects if self._pods.synced else self._previous_pods
        if self._pods_task is not None:
            self._pods_task.cancel()
        self._pods = Reflector(
            session, Resource("", "v1", "pods", self.config.namespace), parse_pod, self._notify,
            label_selector=selector.render(), timings=self.config.timings, max_objects=self.config.max_pods,
        )
        self._pods.fatal_forbidden = not self.synced
        self._pods_task = asyncio.create_task(self._pods.run(), name="kubernetes-pods")
        self._pods_task.add_done_callback(lambda _: self._notify())
        log.info("kubernetes_pods_watch_started", namespace=self.config.namespace, selector=selector.render())

    def _pods_in_force(self) -> dict[str, PodRecord] | None:
        assert self._pods is not None
        if self._pods.synced:
            return self._pods.objects
        return self._previous_pods if self.synced else None

    # -- the loop ------------------------------------------------------------------------------

    async def run(self, pool: EndpointRegistry, stop: asyncio.Event) -> None:
        """Watch until ``stop``; the first complete state becomes the pool's first endpoint list."""
        config = self.config
        access = self._access or await load_cluster_access(config.kubeconfig, self._environ, self._service_account_dir)
        log.info("kubernetes_discovery_starting", source=access.source, watching=config.describe())
        session = ApiSession(access)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + config.sync_timeout_seconds
        tasks: list[asyncio.Task[Any]] = []
        stopper = asyncio.create_task(stop.wait(), name="kubernetes-stop")
        stopper.add_done_callback(lambda _: self._notify())
        try:
            if config.pool_name:
                group = config.pool_group
                self._pool_reflector = Reflector(
                    session, Resource(group, POOL_VERSIONS[group], "inferencepools", config.namespace),
                    _pool_record(group), self._notify, field_selector=f"metadata.name={config.pool_name}",
                    timings=config.timings, max_objects=1,
                )
                tasks.append(asyncio.create_task(self._pool_reflector.run(), name="kubernetes-pool"))
                tasks[-1].add_done_callback(lambda _: self._notify())
            selector: LabelSelector | None = None
            while not stop.is_set():
                self._check_tasks(tasks)
                spec = self.current_spec()
                if spec is not None and spec.selector != selector:
                    selector = spec.selector
                    self._start_pods(session, selector)
                self._update(pool, spec)
                self._changed.clear()
                timeout = None if self.synced else deadline - loop.time()
                if timeout is not None and timeout <= 0:
                    raise self._sync_timeout()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), timeout)
        finally:
            stopper.cancel()
            for task in [*tasks, *([self._pods_task] if self._pods_task else [])]:
                task.cancel()
            for task in [*tasks, *([self._pods_task] if self._pods_task else [])]:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            await session.close()

    def _update(self, pool: EndpointRegistry, spec: PoolSpec | None) -> None:
        if spec is None:
            if self.synced and self._applied and self._pool_reflector is not None and self._pool_reflector.synced:
                log.warning("kubernetes_pool_gone", pool=self.config.pool_name, namespace=self.config.namespace)
                self._apply(pool, [])
            return
        pods = self._pods_in_force() if self._pods is not None else None
        if pods is None or not (self.synced or all(r.watching for r in self.reflectors)):
            return  # the first sync also waits for the watches, so that a 403 on one stops startup
        self._apply(pool, self.endpoints_for(spec, pods.values()))
        if not self.synced:
            self.synced = True
            for reflector in (self._pool_reflector, self._pods):
                if reflector is not None:
                    reflector.fatal_forbidden = False
            log.info("kubernetes_discovery_synced", endpoints=len(self._applied), watching=self.config.describe())

    def _check_tasks(self, tasks: list[asyncio.Task[Any]]) -> None:
        """A reflector ends only on a fatal error (403 before the first sync): re-raise it."""
        for task in [*tasks, *([self._pods_task] if self._pods_task else [])]:
            if task.done() and not task.cancelled() and task.exception() is not None:
                exc = task.exception()
                if isinstance(exc, ApiStatusError) and exc.code == 403:
                    raise ConfigError(
                        "rbac", f"forbidden to {exc.verb} {exc.resource} in namespace {self.config.namespace}: "
                        f"{exc.message or exc.reason} (grant {exc.verb} on {exc.resource} to the service account)",
                    ) from exc
                assert exc is not None
                raise exc

    def _sync_timeout(self) -> ConfigError:
        config = self.config
        errors = "; ".join(r.last_error for r in self.reflectors if r.last_error)
        if self._pool_reflector is not None and self._pool_reflector.synced and self.current_spec() is None:
            return ConfigError("--pool-name", f"InferencePool {config.namespace}/{config.pool_name} not found "
                               f"within {config.sync_timeout_seconds:g}s")
        return ConfigError("kubernetes", f"no complete list of {config.describe()} within "
                           f"{config.sync_timeout_seconds:g}s" + (f": {errors}" if errors else ""))
