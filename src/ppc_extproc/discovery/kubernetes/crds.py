"""Watch the pool's InferenceModelRewrites and InferenceObjectives into the request path's tables.

As llm-d (``llm-d/llm-d-router: pkg/epp/server/controller_config.go``): each kind is read from
``llm-d.ai/v1alpha2`` when that group serves it, else from the legacy
``inference.networking.x-k8s.io/v1alpha2``; a kind served by neither is skipped with one log line
(the CRD is not installed). Objects in the pool's namespace whose ``spec.poolRef.name`` is the pool
apply. Each kind is a list + watch (``Reflector``); a 403 backs off and retries rather than
stopping the service: these CRDs only refine routing.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import Any

import aiohttp
import structlog

from ppc_extproc.discovery.kubernetes.auth import ClusterAccess, load_cluster_access
from ppc_extproc.discovery.kubernetes.client import ApiSession, Reflector, Resource, WatchTimings
from ppc_extproc.scheduling.objectives import (
    ModelRewrites,
    Objectives,
    RewriteRule,
    parse_model_rewrite,
    parse_objective,
)

__all__ = ["CRD_GROUPS", "CrdWatcher"]

log = structlog.get_logger(__name__)

#: Where llm-d looks for InferenceObjective and InferenceModelRewrite, in order of preference.
CRD_GROUPS = (("llm-d.ai", "v1alpha2"), ("inference.networking.x-k8s.io", "v1alpha2"))
_MAX_OBJECTS = 10_000


class CrdWatcher:
    """Keeps ``rewrites`` and ``objectives`` equal to the cluster's objects for one pool."""

    def __init__(self, namespace: str, pool_name: str, rewrites: ModelRewrites, objectives: Objectives, *,
                 kubeconfig: str | None = None, access: ClusterAccess | None = None,
                 timings: WatchTimings | None = None) -> None:
        self.namespace, self.pool_name = namespace, pool_name
        self.rewrites, self.objectives = rewrites, objectives
        self._kubeconfig, self._access = kubeconfig, access
        self._timings = timings or WatchTimings()
        self.reflectors: dict[str, Reflector[Any]] = {}

    async def _served(self, session: ApiSession, plural: str) -> Resource | None:
        """The first group serving ``plural`` (404: that group or kind is not installed)."""
        timeout = aiohttp.ClientTimeout(total=self._timings.list_timeout_seconds)
        for group, version in CRD_GROUPS:
            resource = Resource(group, version, plural, self.namespace)
            response = await session.get(resource.path(), [("limit", "1")], timeout)
            response.release()
            if response.status != 404:
                return resource
        log.info("kubernetes_crd_not_installed", resource=plural, groups=[g for g, _ in CRD_GROUPS])
        return None

    def _rewrites_changed(self) -> None:
        reflector = self.reflectors["inferencemodelrewrites"]
        rules: list[RewriteRule] = [rule for rules in reflector.objects.values() for rule in rules]
        self.rewrites.replace(rules)

    def _objectives_changed(self) -> None:
        reflector = self.reflectors["inferenceobjectives"]
        self.objectives.replace(dict(entry for entry in reflector.objects.values() if entry is not None))

    async def run(self, stop: asyncio.Event) -> None:
        """List and watch both kinds until ``stop``."""
        access = self._access or await load_cluster_access(self._kubeconfig)
        session = ApiSession(access)
        tasks = []
        try:
            for plural, parse, changed in (
                ("inferencemodelrewrites", self._parse_rewrite, self._rewrites_changed),
                ("inferenceobjectives", self._parse_objective, self._objectives_changed),
            ):
                for attempt in range(5):
                    try:
                        resource = await self._served(session, plural)
                        break
                    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                        log.warning("kubernetes_request_failed", resource=plural, error=str(exc) or type(exc).__name__)
                        await asyncio.sleep(self._timings.backoff.initial_seconds * 2**attempt)
                else:
                    resource = None
                if resource is None:
                    continue
                reflector: Reflector[Any] = Reflector(session, resource, parse, changed, timings=self._timings,
                                                      max_objects=_MAX_OBJECTS)
                reflector.fatal_forbidden = False
                self.reflectors[plural] = reflector
                tasks.append(asyncio.create_task(reflector.run(), name=f"watch-{plural}"))
            await stop.wait()
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            await session.close()

    def _parse_rewrite(self, obj: Mapping[str, Any]) -> list[RewriteRule]:
        return parse_model_rewrite(obj, self.pool_name)

    def _parse_objective(self, obj: Mapping[str, Any]) -> tuple[str, int] | None:
        return parse_objective(obj, self.pool_name)
