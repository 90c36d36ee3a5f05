"""Bearer-token authentication and authorisation of ``/metrics`` through the Kubernetes API.

What llm-d's ``--metrics-endpoint-auth`` does (controller-runtime ``pkg/metrics/filters``,
``WithAuthenticationAndAuthorization``): the request's ``Authorization: Bearer`` token goes to a
``TokenReview`` (``authentication.k8s.io/v1``); an unauthenticated request is answered 401. The
authenticated user then goes to a ``SubjectAccessReview`` (``authorization.k8s.io/v1``) for the
non-resource URL of the request with the HTTP method as verb (``get`` on ``/metrics``); not allowed
is 403. Verdicts are cached for a short time (bounded table), so a Prometheus scrape every few
seconds costs about one review pair per cache period. An API error is 500, never an open door.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import aiohttp
import orjson
import structlog

from ppc_extproc.discovery.kubernetes.auth import ClusterAccess, load_cluster_access
from ppc_extproc.discovery.kubernetes.client import ApiSession

__all__ = ["MetricsAuthorizer"]

log = structlog.get_logger(__name__)

_TOKEN_REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
_ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
_MAX_BODY_BYTES = 256 * 1024


class MetricsAuthorizer:
    """``await check(authorization_header, path, method)`` → HTTP status: 200, 401, 403 or 500."""

    def __init__(self, *, kubeconfig: str | None = None, access: ClusterAccess | None = None,
                 cache_seconds: float = 10.0, max_cached: int = 1024, request_timeout_seconds: float = 5.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._kubeconfig, self._access = kubeconfig, access
        self._session: ApiSession | None = None
        self._cache: OrderedDict[tuple[str, str, str], tuple[float, int]] = OrderedDict()
        self.cache_seconds, self.max_cached = cache_seconds, max_cached
        self._timeout = aiohttp.ClientTimeout(total=request_timeout_seconds)
        self._clock = clock

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        if self._session is None:
            self._session = ApiSession(self._access or await load_cluster_access(self._kubeconfig))
        response = await self._session.request("POST", path, body, self._timeout)
        try:
            raw = await response.content.read(_MAX_BODY_BYTES)
        finally:
            response.release()
        if response.status not in (200, 201):
            raise RuntimeError(f"POST {path}: {response.status} {raw[:200]!r}")
        decoded = orjson.loads(raw)
        return decoded if isinstance(decoded, dict) else {}

    async def _review(self, token: str, path: str, verb: str) -> int:
        review = await self._post(_TOKEN_REVIEWS, {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                                                   "spec": {"token": token}})
        status = review.get("status") or {}
        if not status.get("authenticated"):
            return 401
        user = status.get("user") or {}
        spec: dict[str, Any] = {"user": user.get("username", ""), "groups": user.get("groups") or [],
                                "uid": user.get("uid", ""), "nonResourceAttributes": {"path": path, "verb": verb}}
        if user.get("extra"):
            spec["extra"] = user["extra"]
        access = await self._post(_ACCESS_REVIEWS, {"apiVersion": "authorization.k8s.io/v1",
                                                    "kind": "SubjectAccessReview", "spec": spec})
        return 200 if (access.get("status") or {}).get("allowed") else 403

    async def check(self, authorization: str | None, path: str, method: str) -> int:
        """The status to answer with (200: serve the request)."""
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return 401
        verb = method.lower()
        key = (hashlib.sha256(token.strip().encode()).hexdigest(), path, verb)
        now = self._clock()
        cached = self._cache.get(key)
        if cached is not None and cached[0] > now:
            return cached[1]
        try:
            verdict = await self._review(token.strip(), path, verb)
        except (aiohttp.ClientError, TimeoutError, OSError, RuntimeError, orjson.JSONDecodeError) as exc:
            log.warning("metrics_auth_review_failed", error=str(exc) or type(exc).__name__)
            return 500
        self._cache[key] = (now + self.cache_seconds, verdict)
        self._cache.move_to_end(key)
        while len(self._cache) > self.max_cached:
            self._cache.popitem(last=False)
        return verdict

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
