"""A Kubernetes API server fake that speaks the real wire protocol over a socket (aiohttp).

What it serves, as kube-apiserver does (``kubernetes/website: content/en/docs/reference/using-api/
api-concepts.md``; ``kubernetes/apiserver: pkg/storage/cacher/cache_watcher.go``):

* ``GET /api/v1/namespaces/{ns}/pods`` and ``GET /apis/{group}/{version}/namespaces/{ns}/{plural}``:
  a list ``{"kind": "…List", "metadata": {"resourceVersion", "continue"?}, "items"}``, filtered by
  ``labelSelector`` and ``fieldSelector=metadata.name=…``, paginated with ``limit``/``continue`` unless
  ``resourceVersion=0`` (the watch cache ignores limits);
* ``…?watch=1&resourceVersion=…&allowWatchBookmarks=true&timeoutSeconds=…``: a chunked stream of
  newline-delimited ``{"type", "object"}`` events, replaying history after the version, ending
  after ``timeoutSeconds``. With a selector, an object that starts matching arrives as ADDED and one
  that stops matching as DELETED with its previous content;
* versions at or below the compaction point are gone: a watch from one gets an ERROR event with a
  410 ``Status`` (or, ``gone_as="http"``, an HTTP 410 with the same body);
* ``coordination.k8s.io/v1`` Leases by name: ``GET …/leases/{name}`` (404 when missing), ``POST
  …/leases`` (409 AlreadyExists) and ``PUT …/leases/{name}`` whose ``metadata.resourceVersion`` must
  be the stored one (409 Conflict otherwise), as optimistic concurrency works on a real server;
* ``POST /apis/authentication.k8s.io/v1/tokenreviews`` (a token in ``reviewed_tokens`` is that
  user) and ``POST /apis/authorization.k8s.io/v1/subjectaccessreviews`` (allowed when the user is in
  ``metrics_readers`` and the non-resource request is ``get /metrics``), as a real API server answers
  them for controller-runtime's metrics filter;
* bearer-token authentication (401), and optional RBAC rules (403 with the apiserver's message).

The test drives it: ``put``/``delete`` objects (``notify=False`` hides a change from open watches,
as events lost in a gap), ``bookmark()``, ``end_watches()`` (a server-side timeout), ``compact()``.
Every request is recorded as (verb, group, resource, query) for the RBAC cross-check.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import re
import socket
import ssl
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

CORE = ""
POOLS = ("inference.networking.k8s.io", "v1", "inferencepools")
PODS = (CORE, "v1", "pods")
LEASES = ("coordination.k8s.io", "v1", "leases")
PROMETHEUS_USER = "system:serviceaccount:monitoring:prometheus"


@dataclass(frozen=True)
class Rule:
    """An RBAC PolicyRule: apiGroups × resources × verbs."""

    groups: frozenset[str]
    resources: frozenset[str]
    verbs: frozenset[str]

    def allows(self, group: str, resource: str, verb: str) -> bool:
        return group in self.groups and resource in self.resources and verb in self.verbs


@dataclass
class Recorded:
    verb: str
    group: str
    resource: str
    query: dict[str, str]
    token: str


# -- selectors, independently of the code under test ------------------------------------------

_REQ = re.compile(r"^\s*(?:(?P<neg>!)?(?P<key>[\w./-]+)\s*(?:(?P<op>==|=|!=)\s*(?P<val>[\w.-]*)"
                  r"|\s+(?P<setop>in|notin)\s*\((?P<vals>[^)]*)\))?)\s*$")


def _requirements(text: str) -> list[re.Match[str]]:
    parts = re.split(r",(?![^(]*\))", text) if text else []
    out = []
    for part in parts:
        match = _REQ.match(part)
        assert match is not None, f"fake apiserver cannot parse selector part {part!r}"
        out.append(match)
    return out


def label_selector_matches(text: str, labels: dict[str, str]) -> bool:
    for m in _requirements(text):
        key, present = m["key"], m["key"] in labels
        if m["setop"]:
            values = {v.strip() for v in m["vals"].split(",")}
            ok = (present and labels[key] in values) if m["setop"] == "in" else not (present and labels[key] in values)
        elif m["op"] in ("=", "=="):
            ok = present and labels[key] == m["val"]
        elif m["op"] == "!=":
            ok = not present or labels[key] != m["val"]
        else:
            ok = present != bool(m["neg"])
        if not ok:
            return False
    return True


def _field_selector_matches(text: str, obj: dict[str, Any]) -> bool:
    for part in filter(None, text.split(",")):
        key, _, value = part.partition("=")
        assert key == "metadata.name", f"fake apiserver supports only metadata.name field selectors, got {key}"
        if obj["metadata"]["name"] != value:
            return False
    return True


def status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}


# -- the server ---------------------------------------------------------------------------------

@dataclass
class _Watcher:
    key: tuple[str, str, str, str]
    labels: str
    fields: str
    bookmarks: bool
    queue: asyncio.Queue[tuple[str, Any]] = field(default_factory=asyncio.Queue)

    def matches(self, obj: dict[str, Any] | None) -> bool:
        return obj is not None and label_selector_matches(self.labels, obj["metadata"].get("labels") or {}) \
            and _field_selector_matches(self.fields, obj)

    def event(self, kind: str, obj: dict[str, Any], prev: dict[str, Any] | None) -> dict[str, Any] | None:
        """The event this watcher sees for a change (cache_watcher.go convertToWatchEvent)."""
        now, before = (kind != "DELETED" and self.matches(obj)), self.matches(prev)
        if kind == "DELETED":
            return {"type": "DELETED", "object": obj} if self.matches(obj) else None
        if now and not before:
            return {"type": "ADDED", "object": obj}
        if now and before:
            return {"type": "MODIFIED", "object": obj}
        if before and prev is not None:  # left the selector: DELETED, previous content, new version
            gone = copy.deepcopy(prev)
            gone["metadata"]["resourceVersion"] = obj["metadata"]["resourceVersion"]
            return {"type": "DELETED", "object": gone}
        return None


class FakeApiServer:
    """See the module docstring. ``start()``/``stop()`` on the running loop; ``url`` once started."""

    def __init__(self, *, tokens: Iterable[str] = ("test-token",), ssl_context: ssl.SSLContext | None = None,
                 rules: list[Rule] | None = None, gone_as: str = "event", page_size: int | None = None,
                 list_gone_below_compaction: bool = False) -> None:
        self.tokens = set(tokens)
        self.ssl_context = ssl_context
        self.rules = rules
        self.gone_as = gone_as
        self.page_size = page_size
        #: Lists at a compacted version fail with 410 too (as with resourceVersionMatch=Exact).
        self.list_gone_below_compaction = list_gone_below_compaction
        self.rv = 1000
        self.compacted = 0
        self.store: dict[tuple[str, str, str, str], dict[str, dict[str, Any]]] = {}
        self.history: list[tuple[int, tuple[str, str, str, str], str, dict[str, Any], dict[str, Any] | None]] = []
        self.watchers: list[_Watcher] = []
        self.requests: list[Recorded] = []
        #: TokenReview: token → username; SubjectAccessReview: users allowed ``get /metrics``.
        self.reviewed_tokens: dict[str, str] = {"prometheus-token": PROMETHEUS_USER, "stranger-token": "system:anonymous-ish"}
        self.metrics_readers: set[str] = {PROMETHEUS_USER}
        #: (group, resource) pairs the server does not serve (a CRD not installed): 404 after authorisation.
        self.missing: set[tuple[str, str]] = set()
        #: When set, list requests of this (group, resource) wait for the event before answering.
        self.hold_lists: dict[tuple[str, str], asyncio.Event] = {}
        self.port = 0
        self._runner: web.AppRunner | None = None

    # -- lifecycle --

    @staticmethod
    def free_port() -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])

    async def start(self, port: int = 0) -> None:
        app = web.Application()
        app.router.add_get("/api/{version}/namespaces/{ns}/{plural}", self._collection)
        app.router.add_get("/apis/{group}/{version}/namespaces/{ns}/{plural}", self._collection)
        app.router.add_get("/apis/coordination.k8s.io/v1/namespaces/{ns}/leases/{name}", self._lease)
        app.router.add_post("/apis/coordination.k8s.io/v1/namespaces/{ns}/leases", self._lease)
        app.router.add_put("/apis/coordination.k8s.io/v1/namespaces/{ns}/leases/{name}", self._lease)
        app.router.add_post("/apis/authentication.k8s.io/v1/tokenreviews", self._token_review)
        app.router.add_post("/apis/authorization.k8s.io/v1/subjectaccessreviews", self._access_review)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", port, ssl_context=self.ssl_context, reuse_address=True)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        self.end_watches()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @property
    def url(self) -> str:
        return f"{'https' if self.ssl_context else 'http'}://127.0.0.1:{self.port}"

    # -- state the test drives --

    def put(self, resource: tuple[str, str, str], namespace: str, obj: dict[str, Any], *, notify: bool = True) -> dict[str, Any]:
        key = (*resource, namespace)
        collection = self.store.setdefault(key, {})
        obj = copy.deepcopy(obj)
        name = obj["metadata"]["name"]
        prev = collection.get(name)
        self.rv += 1
        obj["metadata"].update(namespace=namespace, resourceVersion=str(self.rv))
        obj["metadata"].setdefault("uid", f"uid-{name}-{self.rv}" if prev is None else prev["metadata"]["uid"])
        collection[name] = obj
        self._record(key, "ADDED" if prev is None else "MODIFIED", obj, prev, notify)
        return obj

    def delete(self, resource: tuple[str, str, str], namespace: str, name: str, *, notify: bool = True) -> None:
        key = (*resource, namespace)
        prev = self.store[key].pop(name)
        self.rv += 1
        gone = copy.deepcopy(prev)
        gone["metadata"]["resourceVersion"] = str(self.rv)
        self._record(key, "DELETED", gone, prev, notify)

    def _record(self, key: tuple[str, str, str, str], kind: str, obj: dict[str, Any], prev: dict[str, Any] | None,
                notify: bool) -> None:
        self.history.append((self.rv, key, kind, obj, prev))
        if notify:
            for watcher in self.watchers:
                if watcher.key == key:
                    watcher.queue.put_nowait(("change", (kind, obj, prev)))

    def bookmark(self) -> None:
        """A BOOKMARK at the current version to every watch that allowed them."""
        self.rv += 1  # the store moved on (other collections), as on a real server
        for watcher in self.watchers:
            if watcher.bookmarks:
                watcher.queue.put_nowait(("bookmark", str(self.rv)))

    def end_watches(self) -> None:
        """End every open watch cleanly, as the server does at ``timeoutSeconds``."""
        for watcher in self.watchers:
            watcher.queue.put_nowait(("end", None))

    def compact(self, *, error_open_watches: bool = True) -> None:
        """Every version before now is gone; open watches get an ERROR 410 (or are left as they are)."""
        self.compacted = self.rv
        if error_open_watches:
            for watcher in self.watchers:
                watcher.queue.put_nowait(("gone", None))

    def calls(self, resource: str, verb: str | None = None) -> list[Recorded]:
        return [r for r in self.requests if r.resource == resource and verb in (None, r.verb)]

    # -- HTTP --

    def _json(self, body: dict[str, Any], code: int = 200) -> web.Response:
        return web.Response(body=orjson.dumps(body), status=code, content_type="application/json")

    def _gone_status(self, since: str) -> dict[str, Any]:
        return status(410, "Expired", f"too old resource version: {since} ({self.compacted})")

    async def _collection(self, request: web.Request) -> web.StreamResponse:
        group = request.match_info.get("group", CORE)
        version, namespace, plural = request.match_info["version"], request.match_info["ns"], request.match_info["plural"]
        query = dict(request.query)
        verb = "watch" if query.get("watch") in ("1", "true") else "list"
        auth = request.headers.get("Authorization", "")
        token = auth.removeprefix("Bearer ")
        self.requests.append(Recorded(verb, group, plural, query, token))
        if token not in self.tokens:
            return self._json(status(401, "Unauthorized", "Unauthorized"), 401)
        if self.rules is not None and not any(r.allows(group, plural, verb) for r in self.rules):
            return self._json(status(403, "Forbidden", f'{plural}{"." + group if group else ""} is forbidden: User '
                                     f'"system:serviceaccount:{namespace}:ppc-extproc" cannot {verb} resource "{plural}" '
                                     f'in API group "{group}" in the namespace "{namespace}"'), 403)
        if (group, plural) in self.missing:
            return self._json(status(404, "NotFound", "the server could not find the requested resource"), 404)
        key = (group, version, plural, namespace)
        if verb == "watch":
            return await self._watch(request, key, query)
        hold = self.hold_lists.get((group, plural))
        if hold is not None:
            await hold.wait()
        return self._list(key, query)

    def _denied(self, request: web.Request, group: str, plural: str, verb: str) -> web.Response | None:
        """401/403 for a request, recording it; None when it may proceed."""
        token = request.headers.get("Authorization", "").removeprefix("Bearer ")
        namespace = request.match_info.get("ns", "")
        self.requests.append(Recorded(verb, group, plural, dict(request.query), token))
        if token not in self.tokens:
            return self._json(status(401, "Unauthorized", "Unauthorized"), 401)
        if self.rules is not None and not any(r.allows(group, plural, verb) for r in self.rules):
            return self._json(status(403, "Forbidden", f'{plural}.{group} is forbidden: User '
                                     f'"system:serviceaccount:{namespace}:ppc-extproc" cannot {verb} resource "{plural}" '
                                     f'in API group "{group}" in the namespace "{namespace}"'), 403)
        return None

    async def _token_review(self, request: web.Request) -> web.Response:
        if (denied := self._denied(request, "authentication.k8s.io", "tokenreviews", "create")) is not None:
            return denied
        review = await request.json()
        user = self.reviewed_tokens.get(review["spec"]["token"])
        review["status"] = {"authenticated": True, "user": {"username": user, "uid": f"uid-{user}",
                                                            "groups": ["system:authenticated"]}} if user else {}
        return self._json(review, 201)

    async def _access_review(self, request: web.Request) -> web.Response:
        if (denied := self._denied(request, "authorization.k8s.io", "subjectaccessreviews", "create")) is not None:
            return denied
        review = await request.json()
        spec = review["spec"]
        allowed = spec.get("user") in self.metrics_readers and spec.get("nonResourceAttributes") == {
            "path": "/metrics", "verb": "get"}
        review["status"] = {"allowed": allowed}
        return self._json(review, 201)

    def lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The stored Lease, or None."""
        return self.store.get((*LEASES, namespace), {}).get(name)

    async def _lease(self, request: web.Request) -> web.Response:
        namespace = request.match_info["ns"]
        verb = {"GET": "get", "POST": "create", "PUT": "update"}[request.method]
        if (denied := self._denied(request, LEASES[0], "leases", verb)) is not None:
            return denied
        name = request.match_info.get("name", "")
        current = self.lease(namespace, name) if name else None
        if verb == "get":
            if current is None:
                return self._json(status(404, "NotFound", f'leases.coordination.k8s.io "{name}" not found'), 404)
            return self._json(current)
        body = await request.json()
        name = name or body["metadata"]["name"]
        current = self.lease(namespace, name)
        if verb == "create":
            if current is not None:
                return self._json(status(409, "AlreadyExists", f'leases.coordination.k8s.io "{name}" already exists'), 409)
            return self._json(self.put(LEASES, namespace, body), 201)
        if current is None:
            return self._json(status(404, "NotFound", f'leases.coordination.k8s.io "{name}" not found'), 404)
        if body["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
            return self._json(status(409, "Conflict", f'Operation cannot be fulfilled on leases.coordination.k8s.io '
                                     f'"{name}": the object has been modified; please apply your changes to the '
                                     'latest version and try again'), 409)
        return self._json(self.put(LEASES, namespace, body))

    def _selected(self, key: tuple[str, str, str, str], query: dict[str, str]) -> list[dict[str, Any]]:
        labels, fields = query.get("labelSelector", ""), query.get("fieldSelector", "")
        return [o for _, o in sorted(self.store.get(key, {}).items())
                if label_selector_matches(labels, o["metadata"].get("labels") or {}) and _field_selector_matches(fields, o)]

    def _list(self, key: tuple[str, str, str, str], query: dict[str, str]) -> web.Response:
        since = query.get("resourceVersion", "")
        if self.list_gone_below_compaction and since not in ("", "0") and int(since) < self.compacted:
            return self._json(self._gone_status(since), 410)
        items = self._selected(key, query)
        list_rv, offset = str(self.rv), 0
        if "continue" in query:
            list_rv, _, start = base64.b64decode(query["continue"]).decode().partition(":")
            offset = int(start)
        metadata: dict[str, Any] = {"resourceVersion": list_rv}
        limit = int(query.get("limit", "0"))
        if self.page_size:
            limit = min(limit, self.page_size) if limit else 0
        if limit and query.get("resourceVersion") != "0":
            if offset + limit < len(items):
                metadata["continue"] = base64.b64encode(f"{list_rv}:{offset + limit}".encode()).decode()
            items = items[offset:offset + limit]
        kind = ("Pod" if key[2] == "pods" else "InferencePool") + "List"
        return self._json({"kind": kind, "apiVersion": "/".join(filter(None, key[:2])), "metadata": metadata, "items": items})

    async def _watch(self, request: web.Request, key: tuple[str, str, str, str], query: dict[str, str]) -> web.StreamResponse:
        since = query.get("resourceVersion", "")
        gone = since not in ("", "0") and int(since) < self.compacted
        if gone and self.gone_as == "http":
            return self._json(self._gone_status(since), 410)
        watcher = _Watcher(key, query.get("labelSelector", ""), query.get("fieldSelector", ""),
                           query.get("allowWatchBookmarks") == "true")
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)

        async def send(event: dict[str, Any]) -> None:
            await response.write(orjson.dumps(event) + b"\n")

        if gone:
            await send({"type": "ERROR", "object": self._gone_status(since)})
            return response
        self.watchers.append(watcher)
        try:
            start = int(since) if since not in ("", "0") else self.rv
            backlog = [(kind, obj, prev) for rv, k, kind, obj, prev in self.history if k == key and rv > start]
            for kind, obj, prev in backlog:
                if (event := watcher.event(kind, obj, prev)) is not None:
                    await send(event)
            deadline = asyncio.get_running_loop().time() + float(query.get("timeoutSeconds", "1800"))
            while True:
                remaining = deadline - asyncio.get_running_loop().time()
                if remaining <= 0:
                    break
                try:
                    what, payload = await asyncio.wait_for(watcher.queue.get(), remaining)
                except TimeoutError:
                    break
                if what == "end":
                    break
                if what == "gone":
                    await send({"type": "ERROR", "object": self._gone_status(since)})
                    break
                if what == "bookmark":
                    kind_name = "Pod" if key[2] == "pods" else "InferencePool"
                    await send({"type": "BOOKMARK", "object": {"kind": kind_name, "metadata": {"resourceVersion": payload}}})
                elif (event := watcher.event(*payload)) is not None:
                    await send(event)
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            self.watchers.remove(watcher)
        return response


# -- object builders ----------------------------------------------------------------------------

def pod(name: str, ip: str, *, ready: bool = True, labels: dict[str, str] | None = None, uid: str | None = None,
        deleting: bool = False, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "labels": labels if labels is not None else {"app": "qwen"}}
    if uid is not None:
        metadata["uid"] = uid
    if deleting:
        metadata["deletionTimestamp"] = "2026-08-01T00:00:00Z"
    if annotations:
        metadata["annotations"] = annotations
    return {
        "kind": "Pod", "apiVersion": "v1", "metadata": metadata,
        "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai"}]},
        "status": {"phase": "Running", "podIP": ip, "hostIP": "127.0.99.1",
                   "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def inference_pool(name: str, match_labels: dict[str, str], ports: list[int]) -> dict[str, Any]:
    return {
        "kind": "InferencePool", "apiVersion": "inference.networking.k8s.io/v1", "metadata": {"name": name},
        "spec": {"selector": {"matchLabels": match_labels}, "targetPorts": [{"number": p} for p in ports],
                 "endpointPickerRef": {"name": "ppc-extproc", "kind": "Service", "port": {"number": 9002}}},
    }
