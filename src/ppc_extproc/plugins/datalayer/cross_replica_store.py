"""The Valkey/Redis side of ``redis-syncer``: prefix claims on the routing path, in-flight load by
pub/sub in the background. redis-py (``redis.asyncio``) is imported only when a store is built.

Claims (one ``EVALSHA`` per routing decision): the request's block keys at a few positions
(``claim_positions``: 1, 2, 3, 4, 6, 8, 11, 16, … blocks, and the last), each a string key
``<prefix>:c:<key hex>`` naming the endpoint that some replica routed that prefix to, expiring after
the claim TTL. The script, atomically: reads those keys; if an allowed endpoint other than the local
pick holds a deeper prefix than the pick's known cached blocks, that endpoint is the answer; then
it claims every unclaimed key (and refreshes the answer's) for the answer. Two replicas routing
siblings of one prompt at the same instant therefore agree on one endpoint.

In-flight load (no keys at all): each replica ``PUBLISH``es its own counts on ``<prefix>:inflight``
after every local change (at once on a dedicated connection, ``cross_replica_pubsub``, or
coalesced to one message per 2 ms in the background) and at least every sync interval, each
message numbered so that a receiver drops one that crossed a newer one; each replica subscribes
and keeps the latest message of every other replica for ``state_ttl`` seconds, so a replica that
died stops counting after that.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from functools import lru_cache
from typing import Any

import structlog

from ppc_extproc.ids import EndpointId, RequestKey
from ppc_extproc.plugins.datalayer.cross_replica_pubsub import subscribe_messages

__all__ = ["CLAIM_SCRIPT", "PeerLoad", "RedisStore", "claim_positions", "parse_address", "rendezvous"]

log = structlog.get_logger(__name__)

#: KEYS: claim keys; ARGV: ttl ms, pick, pick's known blocks, n allowed, allowed…, depth per key.
#: Returns {answer, deepest claimed depth of the answer (0: none)}.
CLAIM_SCRIPT = """
local ttl = ARGV[1]
local pick = ARGV[2]
local known = tonumber(ARGV[3])
local n = tonumber(ARGV[4])
local allowed = {}
for i = 1, n do allowed[ARGV[4 + i]] = true end
local base = 4 + n
local owners = redis.call('MGET', unpack(KEYS))
local best, best_depth = false, 0
for i = 1, #KEYS do
  local owner = owners[i]
  if owner and allowed[owner] then
    local depth = tonumber(ARGV[base + i])
    if depth > best_depth then best, best_depth = owner, depth end
  end
end
local answer = pick
if best and best ~= pick and best_depth > known then answer = best end
for i = 1, #KEYS do
  local owner = owners[i]
  if not owner or owner == answer then redis.call('SET', KEYS[i], answer, 'PX', ttl) end
end
if answer == best then return {answer, best_depth} end
return {answer, 0}
"""


def claim_positions(blocks: int, limit: int = 24) -> list[int]:
    """Block counts to claim at for a prompt of ``blocks`` blocks: roughly ×1.4 apart (1, 2, 3, 4,
    6, 8, 11, 16, 23, 32, …), at most ``limit``, always ending at ``blocks`` itself."""
    out: list[int] = []
    depth = 1
    while depth < blocks and len(out) < limit - 1:
        out.append(depth)
        depth = max(depth + 1, int(depth * 1.4142 + 0.5))
    if blocks > 0:
        out.append(blocks)
    return out


_MASK64 = (1 << 64) - 1


@lru_cache(maxsize=4096)
def _endpoint_seed(endpoint: str) -> int:
    return int.from_bytes(hashlib.blake2b(endpoint.encode(), digest_size=8).digest(), "little")


def _mix64(x: int) -> int:
    """splitmix64's finaliser: every input bit moves every output bit."""
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def rendezvous(key: int, endpoints: Sequence[str]) -> str:
    """The endpoint of ``endpoints`` (non-empty) with the highest rendezvous weight for ``key``:
    the same on every replica and process, and removing an endpoint moves only its own keys."""
    return max(endpoints, key=lambda ep: (_mix64((key ^ _endpoint_seed(ep)) & _MASK64), ep))


def parse_address(address: str) -> tuple[str, int, int | None]:
    """``host:port``, ``redis://host:port[/db]`` or ``host`` → (host, port, db or None)."""
    text = address.strip()
    db: int | None = None
    for scheme in ("redis://", "valkey://"):
        if text.startswith(scheme):
            text = text[len(scheme):]
            text, _, path = text.partition("/")
            db = int(path) if path else None
            break
    host, sep, port = text.rpartition(":")
    if not sep:
        return text, 6379, db
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"bad port {port!r} in {address!r}")
    return host.strip("[]") or "localhost", int(port), db


class PeerLoad:
    """The other replicas' latest in-flight messages, aged out after ``state_ttl`` seconds; at most
    ``max_peers`` replicas (a message from one more is dropped and counted)."""

    def __init__(
        self, replica_id: str, state_ttl: float, clock: Callable[[], float] = time.monotonic, max_peers: int = 256
    ) -> None:
        self.replica_id = replica_id
        self._own_text = '{"r":' + json.dumps(replica_id) + ","
        self._own_prefix = self._own_text.encode()
        self.max_peers = max_peers
        self.state_ttl = state_ttl
        self.clock = clock
        self._peers: dict[str, tuple[float, dict[EndpointId, tuple[int, int]]]] = {}
        #: The latest sequence number taken per replica (messages from two connections can cross).
        self._seq: dict[str, int] = {}
        #: Messages older than one already taken from the same replica (dropped).
        self.stale = 0
        #: Messages that did not decode (counted and dropped).
        self.malformed = 0
        self.new_peer = False

    def receive(self, payload: bytes | str, max_endpoints: int = 4096) -> bool:
        """Take one message; True if it changed the view (it came from another replica)."""
        # this replica's own message (every subscriber hears it), as ``encode_load`` writes it
        if isinstance(payload, bytes) and payload.startswith(self._own_prefix):
            return False
        if isinstance(payload, str) and payload.startswith(self._own_text):
            return False
        try:
            message = json.loads(payload)
            replica = str(message["r"])
            seq = int(message.get("s", 0))
            counts = {
                EndpointId(str(ep)): (int(v[0]), int(v[1])) for ep, v in list(message["e"].items())[:max_endpoints]
            }
        except (ValueError, KeyError, TypeError, IndexError, AttributeError):
            self.malformed += 1
            return False
        if replica == self.replica_id:
            return False
        if seq:
            if seq <= self._seq.get(replica, 0) and replica in self._peers:
                self.stale += 1
                return False
            self._seq[replica] = seq
        #: A replica not heard from before (or since the store came back): it may not know us yet.
        self.new_peer = replica not in self._peers
        if self.new_peer and len(self._peers) >= self.max_peers:
            self.aggregate()  # drop the silent ones first
            if len(self._peers) >= self.max_peers:
                self.malformed += 1  # a bound, not a fleet: counted with the undecodable messages
                return False
        self._peers[replica] = (self.clock(), counts)
        return True

    def clear(self) -> None:
        self._peers.clear()
        self._seq.clear()

    def aggregate(self) -> dict[EndpointId, tuple[int, int]]:
        """Sum over live peers (those heard from within ``state_ttl``); stale peers are dropped."""
        deadline = self.clock() - self.state_ttl
        total: dict[EndpointId, tuple[int, int]] = {}
        for replica, (seen, counts) in list(self._peers.items()):
            if seen < deadline:
                del self._peers[replica]
                self._seq.pop(replica, None)
                continue
            for ep, (n, t) in counts.items():
                if n or t:
                    old = total.get(ep, (0, 0))
                    total[ep] = (old[0] + n, old[1] + t)
        return total

    def live(self) -> int:
        deadline = self.clock() - self.state_ttl
        return sum(1 for seen, _ in self._peers.values() if seen >= deadline)


def encode_load(replica_id: str, counts: dict[EndpointId, tuple[int, int]], seq: int = 0) -> str:
    """One replica's counts; ``seq`` (> 0, increasing) lets receivers drop a message that crossed a newer one."""
    message: dict[str, object] = {"r": replica_id, "e": {ep: [n, t] for ep, (n, t) in counts.items()}}
    if seq:
        message["s"] = seq
    return json.dumps(message, separators=(",", ":"))


class RedisStore:
    """One redis-py client (a bounded connection pool) plus a pub/sub connection."""

    def __init__(
        self, host: str, port: int, *, db: int, password: str | None, prefix: str, timeout_seconds: float,
        max_connections: int = 16,
    ) -> None:
        import redis.asyncio as aioredis  # the shared-state extra; only when configured
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        self.prefix = prefix
        self.host, self.port, self._password = host, port, password
        self.channel = f"{prefix}:inflight"
        self.timeout_seconds = timeout_seconds
        self._redis_errors: tuple[type[BaseException], ...] = (aioredis.RedisError, OSError, ConnectionError,
                                                               asyncio.IncompleteReadError)
        self.client = aioredis.Redis(
            host=host, port=port, db=db, password=password, socket_timeout=timeout_seconds,
            socket_connect_timeout=timeout_seconds, max_connections=max_connections, health_check_interval=0,
            retry=Retry(NoBackoff(), 0),  # the caller retries, on its own schedule
        )  # fmt: skip
        self._claim: Any = self.client.register_script(CLAIM_SCRIPT)

    def claim_key(self, key: RequestKey) -> str:
        return f"{self.prefix}:c:{key:016x}"

    async def claim(
        self, keys: Sequence[RequestKey], depths: Sequence[int], pick: str, known: int, allowed: Sequence[str],
        ttl_ms: int,
    ) -> tuple[str, int]:
        """Run the claim script: (answer, the answer's claimed depth when it is another replica's)."""
        reply = await self._claim(
            keys=[self.claim_key(k) for k in keys],
            args=[ttl_ms, pick, known, len(allowed), *allowed, *depths],
        )
        answer, depth = reply[0], reply[1]
        return (answer.decode() if isinstance(answer, bytes) else str(answer)), int(depth)

    async def drop_idle_connections(self) -> None:
        """Close the pool's idle connections (reopened on next use): after the store was gone they
        are the old server's, and each would fail its next command once."""
        await self.client.connection_pool.disconnect(inuse_connections=False)

    async def publish(self, payload: str) -> None:
        async with asyncio.timeout(self.timeout_seconds):
            await self.client.publish(self.channel, payload)

    async def subscribe(self, on_message: Callable[[bytes], None], on_connected: Callable[[], Awaitable[None]],
                        poll_seconds: float, running: Callable[[], bool]) -> None:
        """Subscribe and deliver messages until the connection fails (then raise) or ``running()``
        turns False. On its own raw connection: the channel carries every replica's every change."""
        await subscribe_messages(self.host, self.port, self._password, self.channel, self.timeout_seconds,
                                 on_message, on_connected, poll_seconds, running)  # fmt: skip

    def is_store_error(self, exc: BaseException) -> bool:
        return isinstance(exc, (*self._redis_errors, TimeoutError))

    async def close(self) -> None:
        try:
            await asyncio.wait_for(self.client.aclose(), self.timeout_seconds)
        except Exception:
            log.debug("redis_close_failed", exc_info=True)
