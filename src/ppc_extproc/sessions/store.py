"""Session bindings shared by router replicas through Valkey or Redis (redis-py's asyncio client).

One string key per session, ``<prefix>:<plugin>:<session key>`` → endpoint id, with the binding's
TTL as the key's expiry (``PX``), so the store holds no binding longer than a replica would.

    read   GETEX key PX ttl                    one round trip, refreshes the TTL
    bind   EVALSHA cas key endpoint expected ttl
           → sets the key when it is unset, already ``endpoint``, or still ``expected`` (the
             binding the replica is replacing: its pod died); otherwise keeps the other
             replica's binding, refreshes it, and returns it: the caller adopts the winner.

redis-py is an optional dependency (``pip install 'ppc-extproc[shared-state]'``), imported when
a store is first opened.
"""

from __future__ import annotations

from typing import Any, Protocol

from ppc_extproc.ids import EndpointId

__all__ = ["BindingStore", "ValkeyBindingStore", "open_store"]

# KEYS[1] session key; ARGV: endpoint, expected previous endpoint ("" when none), ttl in ms.
_CAS = """
local current = redis.call('GET', KEYS[1])
if (not current) or current == ARGV[1] or current == ARGV[2] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3])
  return ARGV[1]
end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return current
"""


class BindingStore(Protocol):
    """Where replicas share bindings. Every call may raise (the caller falls back to local)."""

    async def get(self, key: str, ttl_ms: int) -> EndpointId | None:
        """The shared binding of ``key`` (refreshing its TTL), or None when there is none."""
        ...

    async def bind(self, key: str, endpoint: EndpointId, expected: EndpointId | None, ttl_ms: int) -> EndpointId:
        """Bind ``key`` to ``endpoint`` unless another replica bound it elsewhere meanwhile; the
        binding that holds."""
        ...

    async def close(self) -> None: ...


class ValkeyBindingStore:
    """``BindingStore`` on one Valkey/Redis server (``redis://host:port/db``)."""

    def __init__(self, client: Any, pool: Any = None) -> None:
        self._client = client
        self._pool = pool
        self._cas = client.register_script(_CAS)

    async def get(self, key: str, ttl_ms: int) -> EndpointId | None:
        value = await self._client.getex(key, px=ttl_ms)
        return None if value is None else EndpointId(_text(value))

    async def bind(self, key: str, endpoint: EndpointId, expected: EndpointId | None, ttl_ms: int) -> EndpointId:
        winner = await self._cas(keys=[key], args=[endpoint, expected or "", ttl_ms])
        return EndpointId(_text(winner))

    async def close(self) -> None:
        await self._client.aclose()
        if self._pool is not None:
            await self._pool.aclose()


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def open_store(address: str, timeout_seconds: float) -> ValkeyBindingStore:
    """A store client for ``address`` (connections are made on first use). Raises ImportError
    naming the extra when redis-py is not installed."""
    try:
        import redis.asyncio as redis_asyncio
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise ImportError(
            "shared session bindings need redis-py: pip install 'ppc-extproc[shared-state]'"
        ) from exc
    # Blocking: past max_connections a call waits for a connection (within the caller's timeout)
    # instead of failing with "Too many connections", which would count as the store failing.
    pool = redis_asyncio.BlockingConnectionPool.from_url(
        address,
        max_connections=64,
        timeout=timeout_seconds,
        socket_timeout=timeout_seconds,
        socket_connect_timeout=timeout_seconds,
        retry_on_timeout=False,
        health_check_interval=0,
    )
    return ValkeyBindingStore(redis_asyncio.Redis(connection_pool=pool), pool)
