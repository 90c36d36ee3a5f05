"""List + watch of one namespaced collection, as client-go's reflector does it.

``kubernetes/client-go: tools/cache/reflector.go`` ``ListAndWatch``, reproduced:

* **List** with ``resourceVersion=0`` the first time (served from the watch cache), later with the
  last seen version; a list whose version is gone (410, or "too large resource version") is retried
  at once with ``resourceVersion=""``, paginated (``limit``/``continue``). The list **replaces** the
  cache: objects it lacks are deleted, so a relist neither drops nor duplicates anything.
* **Watch** from the list's version with ``allowWatchBookmarks=true`` and ``timeoutSeconds`` drawn
  uniformly from [min, 2·min) (client-go's ``minWatchTimeout`` × (1 + rand)), reading
  newline-delimited JSON events. ADDED/MODIFIED upsert by name, DELETED removes, BOOKMARK only moves
  the version, ERROR carries a ``Status``: 410 ⇒ relist, anything else ⇒ back off and rewatch.
* A watch that **ends** (server timeout, EOF) is resumed from the last version **without** a relist;
  one that ends within a second having delivered nothing counts as an error.
* Connection errors, 429 and 5xx back off exponentially with jitter (``BackoffPolicy``: client-go's
  800 ms doubling to 30 s, reset after 2 min without failures, jitter 1.0) and rewatch from the
  version held. 401 renews credentials, then backs off. 403 is fatal while ``fatal_forbidden`` is
  set (before the first sync: an RBAC mistake must stop the service); afterwards it backs off.

Resource versions are opaque: compared for equality only, never ordered or parsed
(``kubernetes/website: content/en/docs/reference/using-api/api-concepts.md``).
Every network wait has a timeout; the cache and each page, line and body are bounded.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

import aiohttp
import orjson
import structlog

from ppc_extproc.discovery.kubernetes.session import (
    ApiSession,
    ApiStatusError,
    Backoff,
    BackoffPolicy,
    Resource,
    TransientError,
    WatchTimings,
    status_error,
)

__all__ = [
    "ApiSession",
    "ApiStatusError",
    "Backoff",
    "BackoffPolicy",
    "Reflector",
    "Resource",
    "WatchTimings",
]

log = structlog.get_logger(__name__)

T = TypeVar("T")

_MAX_ERROR_BODY_BYTES = 64 * 1024
_MAX_LIST_BODY_BYTES = 256 * 1024 * 1024
_SHORT_WATCH_SECONDS = 1.0
_PAGE_SIZE = 500


async def _read_bounded(response: aiohttp.ClientResponse, limit: int) -> bytes:
    chunks, size = [], 0
    async for chunk in response.content.iter_chunked(1 << 16):
        size += len(chunk)
        if size > limit:
            raise TransientError(f"response larger than {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _name_and_version(obj: Any) -> tuple[str, str]:
    metadata = obj.get("metadata") if isinstance(obj, Mapping) else None
    if not isinstance(metadata, Mapping):
        return "", ""
    return str(metadata.get("name") or ""), str(metadata.get("resourceVersion") or "")


class Reflector(Generic[T]):
    """Keeps ``objects`` (name → parsed object) equal to the server's collection; calls
    ``on_change`` after every list and every event that changed it. Runs until cancelled."""

    def __init__(
        self,
        session: ApiSession,
        resource: Resource,
        parse: Callable[[Mapping[str, Any]], T],
        on_change: Callable[[], None],
        *,
        label_selector: str = "",
        field_selector: str = "",
        timings: WatchTimings | None = None,
        max_objects: int = 10_000,
        rng: Callable[[], float] = random.random,
    ) -> None:
        self.session, self.resource, self.parse, self.on_change = session, resource, parse, on_change
        self.label_selector, self.field_selector = label_selector, field_selector
        self.timings = timings or WatchTimings()
        self.max_objects = max_objects
        self.rng = rng
        self.objects: dict[str, T] = {}
        self.synced = False
        #: A watch has been accepted (the list and the watch are both authorised).
        self.watching = False
        #: Raise ApiStatusError on 403 instead of backing off (cleared once discovery has synced).
        self.fatal_forbidden = True
        self.resource_version = ""
        self.last_error: str = ""
        #: Requests made: lists (pages count once), watches, relists after the first list.
        self.lists = 0
        self.watches = 0
        self._version_unavailable = False
        self._cap_logged = False
        #: A watch delivered an event or ended normally since the last 410 relist.
        self._progress = True
        self._backoff = Backoff(self.timings.backoff, rng)

    # -- requests ------------------------------------------------------------------------------

    def _selectors(self) -> list[tuple[str, str]]:
        query = []
        if self.label_selector:
            query.append(("labelSelector", self.label_selector))
        if self.field_selector:
            query.append(("fieldSelector", self.field_selector))
        return query

    async def _check(self, response: aiohttp.ClientResponse, verb: str) -> None:
        if response.status == 200:
            return
        body = await _read_bounded(response, _MAX_ERROR_BODY_BYTES) if response.status != 401 else b""
        if response.status == 401:
            self.session.access.invalidate()
        raise status_error(body, response.status, verb, self.resource.describe())

    async def _list_at(self, version: str) -> tuple[list[Any], str]:
        """Every item at ``version`` ("" = latest, paginated), and the list's resourceVersion."""
        paginate = version in ("", "0")
        items: list[Any] = []
        token = ""
        max_pages = self.max_objects // _PAGE_SIZE + 2
        timeout = aiohttp.ClientTimeout(total=self.timings.list_timeout_seconds,
                                        sock_connect=self.timings.connect_timeout_seconds)
        for _ in range(max_pages):
            query = self._selectors()
            if token:
                query.append(("continue", token))
            elif version:
                query.append(("resourceVersion", version))
            if paginate:
                query.append(("limit", str(_PAGE_SIZE)))
            async with await self.session.get(self.resource.path(), query, timeout) as response:
                await self._check(response, "list")
                body = await _read_bounded(response, _MAX_LIST_BODY_BYTES)
            try:
                page = orjson.loads(body)
                metadata = page.get("metadata") or {}
                items.extend(page.get("items") or [])
            except (orjson.JSONDecodeError, AttributeError, TypeError) as exc:
                raise TransientError(f"undecodable list: {exc}") from None
            token = str(metadata.get("continue") or "")
            if not token or len(items) >= self.max_objects:
                return items, str(metadata.get("resourceVersion") or "")
        raise TransientError(f"list of {self.resource.describe()} exceeded {max_pages} pages")

    async def list(self) -> None:
        """List and replace the cache (client-go ``Reflector.list`` with ``syncWith``)."""
        version = "" if self._version_unavailable else (self.resource_version or "0")
        self.lists += 1
        try:
            items, list_version = await self._list_at(version)
        except ApiStatusError as exc:
            if not exc.expired:
                raise
            self._version_unavailable = True
            log.info("kubernetes_relist_from_latest", resource=self.resource.describe(), error=str(exc))
            items, list_version = await self._list_at("")
        self._version_unavailable = False
        objects: dict[str, T] = {}
        for item in items:
            name, _ = _name_and_version(item)
            if not name or name in objects:
                continue
            parsed = self._parse(item, name)
            if parsed is not None and self._room(len(objects), name):
                objects[name] = parsed
        self.objects = objects
        self.resource_version = list_version
        first = not self.synced
        self.synced = True
        log.info("kubernetes_listed", resource=self.resource.describe(), objects=len(objects),
                 resource_version=list_version, first=first)
        self.on_change()

    def _parse(self, obj: Mapping[str, Any], name: str) -> T | None:
        try:
            return self.parse(obj)
        except ValueError as exc:
            log.warning("kubernetes_object_invalid", resource=self.resource.describe(), name=name, error=str(exc))
            return None

    def _room(self, size: int, name: str) -> bool:
        if size < self.max_objects:
            return True
        if not self._cap_logged:
            self._cap_logged = True
            log.error("kubernetes_object_cap_reached", resource=self.resource.describe(), cap=self.max_objects, name=name)
        return False

    def _apply(self, event: Any) -> bool:
        """Apply one watch event; True when the cache changed. Raises ApiStatusError for ERROR."""
        if not isinstance(event, Mapping):
            raise TransientError("watch event is not an object")
        kind, obj = event.get("type"), event.get("object")
        name, version = _name_and_version(obj)
        if kind == "ERROR":
            status = obj if isinstance(obj, Mapping) else {}
            raise ApiStatusError(int(status.get("code") or 500), str(status.get("reason") or ""),
                                 str(status.get("message") or ""), "watch", self.resource.describe())
        if version:
            self.resource_version = version
        if kind == "BOOKMARK" or not name:
            return False
        if kind == "DELETED":
            return self.objects.pop(name, None) is not None
        if kind in ("ADDED", "MODIFIED"):
            assert isinstance(obj, Mapping)
            parsed = self._parse(obj, name)
            if parsed is None or (name not in self.objects and not self._room(len(self.objects), name)):
                return False
            self.objects[name] = parsed
            return True
        log.warning("kubernetes_watch_event_unknown", resource=self.resource.describe(), type=str(kind))
        return False

    async def watch(self) -> None:
        """One watch from the held version, until the server ends it (returns) or it fails (raises)."""
        minimum = self.timings.min_watch_timeout_seconds
        timeout_seconds = max(1, int(minimum * (1.0 + self.rng())))
        query = self._selectors() + [
            ("watch", "1"), ("resourceVersion", self.resource_version),
            ("allowWatchBookmarks", "true"), ("timeoutSeconds", str(timeout_seconds)),
        ]
        timeout = aiohttp.ClientTimeout(total=timeout_seconds + self.timings.watch_grace_seconds,
                                        sock_connect=self.timings.connect_timeout_seconds)
        started, events = time.monotonic(), 0
        self.watches += 1
        try:
            async with await self.session.get(self.resource.path(), query, timeout) as response:
                await self._check(response, "watch")
                if not self.watching:
                    self.watching = True
                    self.on_change()
                while True:
                    line = await response.content.readline()
                    if not line:
                        break
                    if not line.strip():
                        continue
                    try:
                        event = orjson.loads(line)
                    except orjson.JSONDecodeError as exc:
                        raise TransientError(f"undecodable watch event: {exc}") from None
                    events += 1
                    changed = self._apply(event)
                    self._progress = True
                    if changed:
                        self.on_change()
        except TimeoutError:
            log.info("kubernetes_watch_abandoned", resource=self.resource.describe(), timeout_seconds=timeout_seconds)
            return
        except ValueError as exc:  # aiohttp: a line beyond the read buffer
            raise TransientError(f"watch event too large: {exc}") from None
        if events == 0 and time.monotonic() - started < _SHORT_WATCH_SECONDS:
            raise TransientError("very short watch: ended within a second without an event")

    # -- the loop ------------------------------------------------------------------------------

    async def run(self) -> None:
        """List, then watch and rewatch, relisting on 410, until cancelled."""
        need_list = True
        while True:
            try:
                if need_list:
                    await self.list()
                    need_list = False
                await self.watch()
                self._progress = True
                continue
            except ApiStatusError as exc:
                self.last_error = str(exc)
                if exc.expired and not need_list:
                    log.info("kubernetes_watch_expired", resource=self.resource.describe(), error=str(exc))
                    need_list = True
                    if self._progress:  # relist at once, unless the last relist made no progress either
                        self._progress = False
                        continue
                if exc.code == 403 and self.fatal_forbidden:
                    raise
                error = str(exc)
            except (TransientError, aiohttp.ClientError, TimeoutError, OSError) as exc:
                error = f"{type(exc).__name__}: {exc}"
                self.last_error = error
            delay = self._backoff.delay()
            log.warning("kubernetes_request_failed", resource=self.resource.describe(), error=error,
                        retry_in_seconds=round(delay, 3), listed=not need_list)
            await asyncio.sleep(delay)
