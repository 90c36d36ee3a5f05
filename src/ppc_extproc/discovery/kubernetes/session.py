"""The API server as the reflector sees it: the watched resource, GETs through
``kubernetes_asyncio``'s client, its error statuses, and client-go's backoff
(``kubernetes/client-go: util/flowcontrol/backoff.go``, ``tools/cache/reflector.go``)."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from ppc_extproc.discovery.kubernetes.auth import ClusterAccess

__all__ = [
    "ApiSession",
    "ApiStatusError",
    "Backoff",
    "BackoffPolicy",
    "Resource",
    "TransientError",
    "WatchTimings",
    "status_error",
]

@dataclass(frozen=True, slots=True)
class Resource:
    """A namespaced collection: ``group`` "" is the core API (pods)."""

    group: str
    version: str
    plural: str
    namespace: str

    def path(self) -> str:
        prefix = f"/api/{self.version}" if not self.group else f"/apis/{self.group}/{self.version}"
        return f"{prefix}/namespaces/{self.namespace}/{self.plural}"

    def describe(self) -> str:
        """``pods`` or ``inferencepools.inference.networking.k8s.io`` (RBAC's spelling)."""
        return self.plural if not self.group else f"{self.plural}.{self.group}"


@dataclass(frozen=True, slots=True)
class BackoffPolicy:
    """Exponential backoff with jitter (client-go ``wait.NewExponentialBackoffManager``)."""

    initial_seconds: float = 0.8
    max_seconds: float = 30.0
    #: A failure this long after the previous one starts again from ``initial_seconds``.
    reset_after_seconds: float = 120.0
    #: Each delay is ``d + rand·jitter·d`` (applied after the cap, as in client-go).
    jitter: float = 1.0


class Backoff:
    """Successive delays of a BackoffPolicy; ``rng`` and ``clock`` are injectable for tests."""

    def __init__(self, policy: BackoffPolicy, rng: Callable[[], float] = random.random,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.policy, self.rng, self.clock = policy, rng, clock
        self._next = policy.initial_seconds
        self._last: float | None = None

    def delay(self) -> float:
        """The next delay to wait before retrying."""
        now = self.clock()
        if self._last is not None and now - self._last > self.policy.reset_after_seconds:
            self._next = self.policy.initial_seconds
        self._last = now
        base = self._next
        self._next = min(self._next * 2, self.policy.max_seconds)
        return base + self.rng() * self.policy.jitter * base


@dataclass(frozen=True, slots=True)
class WatchTimings:
    """Time bounds of list and watch requests."""

    #: Watches ask the server to end after ``timeoutSeconds`` ∈ [min, 2·min) (client-go: 5 min).
    min_watch_timeout_seconds: float = 300.0
    connect_timeout_seconds: float = 10.0
    #: Bound on one list page, request to last byte.
    list_timeout_seconds: float = 60.0
    #: A watch still open this long after its ``timeoutSeconds`` is abandoned and resumed.
    watch_grace_seconds: float = 30.0
    backoff: BackoffPolicy = field(default_factory=BackoffPolicy)


class ApiStatusError(Exception):
    """The API server refused a request: HTTP status (or a watch ERROR's ``code``) and its Status."""

    def __init__(self, code: int, reason: str, message: str, verb: str, resource: str) -> None:
        self.code, self.reason, self.message, self.verb, self.resource = code, reason, message, verb, resource
        super().__init__(f"{verb} {resource}: {code} {reason}: {message}".rstrip(": "))

    @property
    def expired(self) -> bool:
        """410 Gone / Expired, or "too large resource version": the version cannot be served."""
        return self.code == 410 or self.reason in ("Expired", "Gone") or "too large resource version" in self.message.lower()


class TransientError(Exception):
    """A failure to retry after a backoff (network, timeout, short watch, undecodable stream)."""


def status_error(body: bytes, code: int, verb: str, resource: str) -> ApiStatusError:
    reason, message = "", ""
    try:
        status = orjson.loads(body)
        if isinstance(status, dict):
            reason, message = str(status.get("reason") or ""), str(status.get("message") or "")
            code = int(status.get("code") or code)
    except (orjson.JSONDecodeError, ValueError, TypeError):
        message = body[:200].decode("utf-8", "replace")
    return ApiStatusError(code, reason, message, verb, resource)


class ApiSession:
    """Requests through ``kubernetes_asyncio``'s client: its TLS, auth headers and token hooks."""

    def __init__(self, access: ClusterAccess) -> None:
        from kubernetes_asyncio.client import ApiClient

        self.access = access
        self._client = ApiClient(access.configuration)

    async def get(self, path: str, query: list[tuple[str, str]], timeout: aiohttp.ClientTimeout) -> aiohttp.ClientResponse:
        """The raw response (status not checked); the caller reads and closes it."""
        response = await self._client.call_api(
            path, "GET", query_params=query, header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"], _preload_content=False, _request_timeout=timeout,
        )
        assert isinstance(response, aiohttp.ClientResponse)
        return response

    async def request(self, method: str, path: str, body: Any, timeout: aiohttp.ClientTimeout) -> aiohttp.ClientResponse:
        """A JSON request with any verb (status not checked); the caller reads and closes the response."""
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        response = await self._client.call_api(
            path, method, header_params=headers, body=body,
            auth_settings=["BearerToken"], _preload_content=False, _request_timeout=timeout,
        )
        assert isinstance(response, aiohttp.ClientResponse)
        return response

    async def close(self) -> None:
        await self._client.close()
