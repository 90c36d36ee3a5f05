"""``EngineRender``: the request's own engines render it, when no tokenizer is on disk.

vLLM 0.32 serves ``/v1/completions/render`` and ``/v1/chat/completions/render`` with
``--enable-scale-out`` (``vllm/entrypoints/scale_out/render/api_router.py``); without it they
answer 403. Each call goes to one candidate endpoint of the request (rotating), with the
request's model, through a :class:`~ppc_extproc.tokenizer.render_client.RenderClient` per
endpoint (its own circuit breaker) sharing one HTTP pool. An endpoint that answers that it has no
render route (403, 404 ``Not Found``, 405, 501) is not asked again for ``unavailable_seconds``, so
engines without the routes cost nothing per request. At most ``max_engines`` endpoints are
remembered; at most ``attempts`` endpoints are tried per request.
"""

from __future__ import annotations

import itertools
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import aiohttp

from ppc_extproc.framework import Endpoint
from ppc_extproc.ids import destination_host_port
from ppc_extproc.tokenizer.render_client import RenderClient, RenderConfig
from ppc_extproc.tokenizer.requests import Api
from ppc_extproc.tokenizer.result import NO_TOKENIZER, TokenizeResult

__all__ = ["EngineRender"]

_NO_ROUTE = frozenset({"http_403", "http_405", "http_501"})


def _no_route(result: TokenizeResult) -> bool:
    return result.reason in _NO_ROUTE or (result.reason == "http_404" and "Not Found" in result.detail)


class EngineRender:
    """Renders on the request's candidate endpoints (see the module docstring)."""

    def __init__(
        self,
        *,
        timeout_seconds: float = 5.0,
        mm_timeout_seconds: float = 30.0,
        max_engines: int = 256,
        attempts: int = 2,
        unavailable_seconds: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.timeout_seconds = timeout_seconds
        self.mm_timeout_seconds = mm_timeout_seconds
        self.max_engines = max_engines
        self.attempts = attempts
        self.unavailable_seconds = unavailable_seconds
        self._clock = clock
        self._clients: OrderedDict[str, RenderClient] = OrderedDict()
        #: endpoint id → monotonic time until which it is not asked
        self._unavailable: OrderedDict[str, float] = OrderedDict()
        self._session: aiohttp.ClientSession | None = None
        self._turn = itertools.count()

    async def start(self) -> None:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=256, limit_per_host=8, keepalive_timeout=90.0)
            self._session = aiohttp.ClientSession(connector=connector, headers={"Content-Type": "application/json"})

    async def stop(self) -> None:
        self._clients.clear()
        if self._session is not None:
            await self._session.close()
            self._session = None

    def available(self, endpoint: Endpoint) -> bool:
        until = self._unavailable.get(endpoint.id)
        return until is None or self._clock() >= until

    def _client(self, endpoint: Endpoint) -> RenderClient:
        client = self._clients.get(endpoint.id)
        if client is None:
            url = f"http://{destination_host_port(endpoint.id)}"
            config = RenderConfig("unused", url, self.timeout_seconds, self.mm_timeout_seconds,
                                  stall_seconds=min(1.0, self.timeout_seconds))  # fmt: skip
            client = self._clients[endpoint.id] = RenderClient(config, session=self._session)
            while len(self._clients) > self.max_engines:
                self._clients.popitem(last=False)
        else:
            self._clients.move_to_end(endpoint.id)
        return client

    def _mark_unavailable(self, endpoint: Endpoint) -> None:
        self._unavailable[endpoint.id] = self._clock() + self.unavailable_seconds
        self._unavailable.move_to_end(endpoint.id)
        while len(self._unavailable) > self.max_engines:
            self._unavailable.popitem(last=False)

    async def render(
        self, api: Api, body: Mapping[str, Any], headers: Mapping[str, str], model: str, endpoints: Sequence[Endpoint]
    ) -> TokenizeResult:
        """Ids from an engine's render route; ``no_tokenizer`` when no endpoint renders."""
        if self._session is None:
            await self.start()
        usable = [e for e in endpoints if self.available(e)]
        if not usable or not model:
            return TokenizeResult.failed(NO_TOKENIZER, "no engine renders (render routes answered 403/404/405)")
        start = next(self._turn) % len(usable)
        last: TokenizeResult | None = None
        for endpoint in (usable[start:] + usable[:start])[: self.attempts]:
            result = await self._client(endpoint).render(api, body, headers=headers, model=model)
            if result.ok or result.reason == "http_400":  # the engine's own verdict on this body
                return result
            if _no_route(result):
                self._mark_unavailable(endpoint)
            last = result
        assert last is not None
        if _no_route(last):
            return TokenizeResult.failed(NO_TOKENIZER, last.detail, last.cache_salt)
        return last
