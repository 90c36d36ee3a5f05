"""HTTP(S) GET of an engine's ``/metrics`` for ``metrics-data-source``: one aiohttp session for
every endpoint, bounded connections, TLS as the source's parameters say, and a bounded body."""

from __future__ import annotations

import ssl
from collections.abc import Awaitable, Callable

import aiohttp

from ppc_extproc.plugins.datalayer.metrics_poll_config import PollOptions

__all__ = ["Fetch", "HttpFetcher"]

#: ``await fetch(url)`` → the body of a 200 response; raises on anything else. The test seam.
Fetch = Callable[[str], Awaitable[bytes]]


def _ssl_context(options: PollOptions) -> ssl.SSLContext | bool:
    if options.scheme != "https":
        return False
    context = ssl.create_default_context(cafile=options.ca_cert_path or None)
    if options.insecure_skip_verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if options.client_cert_path:
        context.load_cert_chain(options.client_cert_path, options.client_key_path)
    return context


class HttpFetcher:
    """A ``Fetch`` over one session, opened on the running loop and closed by ``close``."""

    def __init__(self, options: PollOptions) -> None:
        self._max_body_bytes = options.max_body_bytes
        self._session: aiohttp.ClientSession | None = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=options.max_concurrency, ttl_dns_cache=60, ssl=_ssl_context(options)),
            headers={"Accept": "text/plain;version=0.0.4", "Accept-Encoding": "identity"},
            cookie_jar=aiohttp.DummyCookieJar(),
        )

    async def __call__(self, url: str) -> bytes:
        session = self._session
        if session is None:
            raise RuntimeError("metrics source is stopped")
        limit = self._max_body_bytes
        async with session.get(url, allow_redirects=False) as response:
            if response.status != 200:
                raise ValueError(f"HTTP {response.status}")
            if (response.content_length or 0) > limit:
                raise ValueError(f"body of {response.content_length} bytes is too large")
            body = await response.content.read(limit + 1)
            if len(body) > limit:
                raise ValueError("body is too large")
            return body

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()
