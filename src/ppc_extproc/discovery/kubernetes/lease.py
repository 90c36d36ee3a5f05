"""Leader election on a ``coordination.k8s.io/v1`` Lease, as llm-d's EPP runs it.

llm-d (``llm-d/llm-d-router: pkg/epp/server/controller_manager.go``, ``NewDefaultManager``) turns on
controller-runtime's leader election with a ``leases`` lock named ``epp-<namespace>-<pool>.llm-d.ai``
in the pool's namespace and ``LeaderElectionReleaseOnCancel``; controller-runtime's defaults apply
(``sigs.k8s.io/controller-runtime: pkg/manager/manager.go``): lease duration 15 s, renew deadline
10 s, retry period 2 s, identity ``<hostname>_<uuid>``. The algorithm is client-go's
(``kubernetes/client-go: tools/leaderelection/leaderelection.go``, ``tryAcquireOrRenew``):

* get the Lease; create it (holder = us) when it is missing;
* a Lease held by someone else counts as expired only once its record has not changed for
  ``leaseDurationSeconds`` **by our own clock** since we first saw that record (no clock-skew trust
  in ``renewTime``); an empty holder is free;
* take or renew it with an update carrying the read ``resourceVersion``: a concurrent writer makes
  it fail with 409 and this round is lost;
* the leader renews every retry period; when no renewal succeeds within the renew deadline it has
  lost the lease. controller-runtime then exits the process; here the replica stops being ready and
  campaigns again (the pod stays up, its readiness alone keeps traffic away);
* on shutdown the leader releases the Lease (empty holder, ``leaseDurationSeconds`` 1), so a
  successor takes over at its next retry instead of after the lease duration.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import aiohttp
import orjson
import structlog

from ppc_extproc.discovery.kubernetes.auth import ClusterAccess, load_cluster_access
from ppc_extproc.discovery.kubernetes.client import ApiSession

__all__ = ["LeaderElector", "LeaseConfig", "default_identity", "lease_name"]

log = structlog.get_logger(__name__)

_MAX_BODY_BYTES = 64 * 1024
#: client-go's ``JitterUntil`` factor for the acquire loop.
_ACQUIRE_JITTER = 1.2


def lease_name(namespace: str, pool_name: str) -> str:
    """llm-d's lease name for an EPP deployment (unique per pool)."""
    return f"epp-{namespace}-{pool_name}.llm-d.ai"


def default_identity() -> str:
    """controller-runtime's holder identity: hostname (the pod name in a pod), ``_``, a UUID."""
    return f"{socket.gethostname()}_{uuid.uuid4()}"


@dataclass(frozen=True, slots=True)
class LeaseConfig:
    """Which Lease to contend for, by whom, with controller-runtime's timings."""

    namespace: str
    name: str
    identity: str
    lease_duration_seconds: float = 15.0
    renew_deadline_seconds: float = 10.0
    retry_period_seconds: float = 2.0
    #: Bound on one API request.
    request_timeout_seconds: float = 5.0

    def path(self) -> str:
        return f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases"


def _micro_time(now: float) -> str:
    """A ``metav1.MicroTime`` (RFC 3339 with microseconds, UTC)."""
    return datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """Contends for the Lease until ``run``'s stop event; ``is_leader`` is the current verdict."""

    def __init__(self, config: LeaseConfig, *, kubeconfig: str | None = None, access: ClusterAccess | None = None,
                 environ: Mapping[str, str] | None = None, monotonic: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        self.config = config
        self._kubeconfig = kubeconfig
        self._access = access
        self._environ = environ
        self._monotonic, self._wall = monotonic, wall
        self.is_leader = False
        #: The last Lease spec seen and when (our clock) it was first seen in that form.
        self._observed: dict[str, Any] | None = None
        self._observed_at = 0.0
        self._session: ApiSession | None = None

    # -- one round ------------------------------------------------------------------------------

    async def _call(self, method: str, path: str, body: dict[str, Any] | None) -> tuple[int, dict[str, Any]]:
        assert self._session is not None
        timeout = aiohttp.ClientTimeout(total=self.config.request_timeout_seconds)
        response = await self._session.request(method, path, body, timeout)
        try:
            raw = await response.content.read(_MAX_BODY_BYTES)
        finally:
            response.release()
        try:
            decoded = orjson.loads(raw) if raw else {}
        except orjson.JSONDecodeError:
            decoded = {}
        return response.status, decoded if isinstance(decoded, dict) else {}

    def _spec(self, now: float, previous: Mapping[str, Any] | None) -> dict[str, Any]:
        mine = previous is not None and previous.get("holderIdentity") == self.config.identity
        transitions = int(previous.get("leaseTransitions") or 0) if previous is not None else 0
        stamp = _micro_time(now)
        return {
            "holderIdentity": self.config.identity,
            "leaseDurationSeconds": max(1, round(self.config.lease_duration_seconds)),
            "acquireTime": previous.get("acquireTime", stamp) if mine and previous is not None else stamp,
            "renewTime": stamp,
            "leaseTransitions": transitions if mine or previous is None else transitions + 1,
        }

    async def try_acquire_or_renew(self) -> bool:
        """One round of client-go's ``tryAcquireOrRenew``: whether we hold the Lease after it."""
        cfg = self.config
        status, lease = await self._call("GET", f"{cfg.path()}/{cfg.name}", None)
        if status == 404:
            body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": cfg.name, "namespace": cfg.namespace}, "spec": self._spec(self._wall(), None)}
            status, created = await self._call("POST", cfg.path(), body)
            if status not in (200, 201):
                log.info("lease_create_failed", lease=cfg.name, status=status, message=created.get("message"))
                return False
            self._observe(created.get("spec") or {})
            return True
        if status != 200:
            log.info("lease_get_failed", lease=cfg.name, status=status, message=lease.get("message"))
            return False
        spec = lease.get("spec") or {}
        self._observe(spec)
        holder = spec.get("holderIdentity") or ""
        duration = float(spec.get("leaseDurationSeconds") or cfg.lease_duration_seconds)
        if holder and holder != cfg.identity and self._observed_at + duration > self._monotonic():
            return False  # held by another and not expired by our clock
        metadata = lease.get("metadata") or {}
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": cfg.name, "namespace": cfg.namespace, "resourceVersion": metadata.get("resourceVersion")},
                "spec": self._spec(self._wall(), spec)}
        status, updated = await self._call("PUT", f"{cfg.path()}/{cfg.name}", body)
        if status != 200:
            if status != 409:  # 409: another replica wrote first, the ordinary way to lose a round
                log.info("lease_update_failed", lease=cfg.name, status=status, message=updated.get("message"))
            return False
        self._observe(updated.get("spec") or {})
        return True

    def _observe(self, spec: Mapping[str, Any]) -> None:
        if spec != self._observed:
            self._observed, self._observed_at = dict(spec), self._monotonic()

    async def _round(self) -> bool:
        try:
            return await self.try_acquire_or_renew()
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            log.info("lease_request_failed", lease=self.config.name, error=str(exc) or type(exc).__name__)
            return False

    # -- the loops ------------------------------------------------------------------------------

    async def _sleep(self, seconds: float, stop: asyncio.Event) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), seconds)

    async def _acquire(self, stop: asyncio.Event) -> bool:
        retry = self.config.retry_period_seconds
        while not stop.is_set():
            if await self._round():
                return True
            await self._sleep(retry + random.random() * _ACQUIRE_JITTER * retry, stop)
        return False

    async def _renew(self, stop: asyncio.Event) -> None:
        """Returns when stopped or when no renewal succeeded within the renew deadline."""
        cfg = self.config
        while not stop.is_set():
            deadline = self._monotonic() + cfg.renew_deadline_seconds
            while not await self._round():
                if stop.is_set() or self._monotonic() + cfg.retry_period_seconds > deadline:
                    return
                await self._sleep(cfg.retry_period_seconds, stop)
            await self._sleep(cfg.retry_period_seconds, stop)

    async def _release(self) -> None:
        cfg = self.config
        try:
            status, lease = await self._call("GET", f"{cfg.path()}/{cfg.name}", None)
            spec = lease.get("spec") or {}
            if status != 200 or spec.get("holderIdentity") != cfg.identity:
                return
            stamp = _micro_time(self._wall())
            body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": cfg.name, "namespace": cfg.namespace,
                                 "resourceVersion": (lease.get("metadata") or {}).get("resourceVersion")},
                    "spec": {"holderIdentity": "", "leaseDurationSeconds": 1, "acquireTime": stamp, "renewTime": stamp,
                             "leaseTransitions": int(spec.get("leaseTransitions") or 0)}}
            status, _ = await self._call("PUT", f"{cfg.path()}/{cfg.name}", body)
            log.info("lease_released", lease=cfg.name, status=status)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            log.info("lease_release_failed", lease=cfg.name, error=str(exc) or type(exc).__name__)

    async def run(self, stop: asyncio.Event) -> None:
        """Campaign, lead, renew; release the Lease when ``stop`` is set while leading."""
        access = self._access or await load_cluster_access(self._kubeconfig, self._environ)
        self._session = ApiSession(access)
        log.info("leader_election_starting", lease=self.config.name, namespace=self.config.namespace,
                 identity=self.config.identity)
        try:
            while not stop.is_set():
                if not await self._acquire(stop):
                    break
                self.is_leader = True
                log.info("leader_elected", lease=self.config.name, identity=self.config.identity)
                await self._renew(stop)
                if stop.is_set():
                    break
                self.is_leader = False
                log.warning("leader_lost", lease=self.config.name, identity=self.config.identity)
        finally:
            if self.is_leader:
                self.is_leader = False
                await self._release()
            await self._session.close()
