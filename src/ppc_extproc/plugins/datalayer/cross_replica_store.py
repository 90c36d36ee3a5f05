"""The Valkey/Redis side of ``redis-syncer``: prefix claims on the routing path, in-flight load by
pub/sub in the background. redis-py (``redis.asyncio``) is imported only when a store is built.

Claims (one ``EVALSHA`` per routing decision, on raw connections: ``cross_replica_claims``): the request's block keys at a few positions
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
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import structlog

from ppc_extproc.ids import EndpointId, RequestKey
from ppc_extproc.plugins.datalayer.cross_replica_claims import ClaimConnections
from ppc_extproc.plugins.datalayer.cross_replica_pubsub import subscribe_messages

__all__ = ["CLAIM_SCRIPT", "ClaimReply", "PeerLoad", "RedisStore", "claim_positions", "parse_address"]

log = structlog.get_logger(__name__)

#: KEYS: claim keys…, this replica's counts hash, the replicas set; ARGV: ttl ms, pick, pick's known
#: blocks, n allowed, allowed… (in the local preference order), depth per claim key, count (1:
#: count the answer in this replica's hash), the hashes' TTL ms, cold (1: no allowed endpoint holds
#: a block of the prompt). Returns {answer, deepest claimed depth of the answer (0: none), the
#: server's TIME (s, µs), endpoint, requests, …}: every live replica's in-flight requests per endpoint before this one.
#: A cold prompt nobody claimed goes to the allowed endpoint with the fewest requests (the first
#: in the preference order among equals).
CLAIM_SCRIPT = """
local nk = #KEYS - 2
local own, replicas = KEYS[nk + 1], KEYS[nk + 2]
local ttl = ARGV[1]
local pick = ARGV[2]
local known = tonumber(ARGV[3])
local n = tonumber(ARGV[4])
local allowed = {}
for i = 1, n do allowed[ARGV[4 + i]] = true end
local base = 4 + n
local count, counts_ttl, cold = ARGV[base + nk + 1], ARGV[base + nk + 2], ARGV[base + nk + 3]
local totals, order = {}, {}
for _, key in ipairs(redis.call('SMEMBERS', replicas)) do
  local h = redis.call('HGETALL', key)
  if #h == 0 and key ~= own then redis.call('SREM', replicas, key) end
  for j = 1, #h, 2 do
    local ep = h[j]
    if not totals[ep] then order[#order + 1] = ep; totals[ep] = 0 end
    totals[ep] = totals[ep] + tonumber(h[j + 1])
  end
end
local owners = redis.call('MGET', unpack(KEYS, 1, nk))
local best, best_depth = false, 0
for i = 1, nk do
  local owner = owners[i]
  if owner and allowed[owner] then
    local depth = tonumber(ARGV[base + i])
    if depth > best_depth then best, best_depth = owner, depth end
  end
end
local answer = pick
if best and best ~= pick and best_depth > known then answer = best end
if cold == '1' and not best then
  local fewest = nil
  for i = 1, n do
    local ep = ARGV[4 + i]
    local c = totals[ep] or 0
    if fewest == nil or c < fewest then answer, fewest = ep, c end
  end
end
for i = 1, nk do
  local owner = owners[i]
  if not owner or owner == answer then redis.call('SET', KEYS[i], answer, 'PX', ttl) end
end
local now = redis.call('TIME')
local out = {answer, 0, now[1], now[2]}
if answer == best then out[2] = best_depth end
if count == '1' then
  redis.call('HINCRBY', own, answer, 1)
  redis.call('PEXPIRE', own, counts_ttl)
  redis.call('SADD', replicas, own)
end
for _, ep in ipairs(order) do out[#out + 1] = ep; out[#out + 1] = totals[ep] end
return out
"""


@dataclass(frozen=True, slots=True)
class ClaimReply:
    """The claim script's answer."""

    answer: str
    #: The answer's deepest claimed depth when another replica claimed it (0: none).
    depth: int
    #: When the script ran, on the server's clock (``TIME``, Unix seconds).
    server_time: float
    #: Every live replica's in-flight requests per endpoint just before this decision.
    requests: dict[EndpointId, int]


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


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
        self._claims = ClaimConnections(host, port, password, db, CLAIM_SCRIPT, connect_timeout=timeout_seconds,
                                        max_idle=max_connections)  # fmt: skip
        self._claim_prefix = f"{prefix}:c:".encode()
        #: Set the hash of this replica's in-flight counts (``own_counts_key``) before use.
        self.counts_key = f"{prefix}:n:-"
        self.replicas_key = f"{prefix}:replicas"

    def own_counts_key(self, replica_id: str) -> str:
        """The key of ``replica_id``'s hash of in-flight requests per endpoint."""
        self.counts_key = f"{self.prefix}:n:{replica_id}"
        return self.counts_key

    def claim_key(self, key: RequestKey) -> str:
        return f"{self.prefix}:c:{key:016x}"

    async def claim(
        self, keys: Sequence[RequestKey], depths: Sequence[int], pick: str, known: int, allowed: Sequence[str],
        ttl_ms: int, *, count: bool = False, counts_ttl_ms: int = 2000, cold: bool = False,
    ) -> ClaimReply:
        """Run the claim script: (answer, the answer's claimed depth when it is another replica's,
        every live replica's in-flight requests per endpoint just before it). ``count``: the
        answer is counted in this replica's hash in the same step; ``cold``: no allowed endpoint
        holds a block, so an unclaimed prompt goes to the one of ``allowed`` (in preference order)
        with the fewest requests."""
        prefix = self._claim_prefix
        reply = await self._claims.evalsha(
            [*(b"%s%016x" % (prefix, k) for k in keys), self.counts_key.encode(), self.replicas_key.encode()],
            [b"%d" % ttl_ms, pick.encode(), b"%d" % known, b"%d" % len(allowed), *(ep.encode() for ep in allowed),
             *(b"%d" % d for d in depths), b"1" if count else b"0", b"%d" % counts_ttl_ms, b"1" if cold else b"0"],
        )  # fmt: skip
        totals = {EndpointId(_text(reply[i])): int(reply[i + 1]) for i in range(4, len(reply) - 1, 2)}
        return ClaimReply(_text(reply[0]), int(reply[1]), int(reply[2]) + int(reply[3]) / 1e6, totals)

    async def drop_idle_connections(self) -> None:
        """Close the pool's idle connections (reopened on next use): after the store was gone they
        are the old server's, and each would fail its next command once."""
        self._claims.close_idle()
        await self.client.connection_pool.disconnect(inuse_connections=False)

    async def publish(self, payload: str, commands: Sequence[tuple[bytes, ...]] = ()) -> None:
        """``commands`` (argument tuples) and one PUBLISH of ``payload``, in one pipeline."""
        async with asyncio.timeout(self.timeout_seconds):
            if not commands:
                await self.client.publish(self.channel, payload)
                return
            pipe = self.client.pipeline(transaction=False)
            for command in commands:
                pipe.execute_command(*command)
            pipe.publish(self.channel, payload)
            await pipe.execute()

    async def subscribe(self, on_message: Callable[[bytes], None], on_connected: Callable[[], Awaitable[None]],
                        poll_seconds: float, running: Callable[[], bool]) -> None:
        """Subscribe and deliver messages until the connection fails (then raise) or ``running()``
        turns False. On its own raw connection: the channel carries every replica's every change."""
        await subscribe_messages(self.host, self.port, self._password, self.channel, self.timeout_seconds,
                                 on_message, on_connected, poll_seconds, running)  # fmt: skip

    def is_store_error(self, exc: BaseException) -> bool:
        return isinstance(exc, (*self._redis_errors, TimeoutError))

    async def close(self) -> None:
        self._claims.close_idle()
        try:
            await asyncio.wait_for(self.client.aclose(), self.timeout_seconds)
        except Exception:
            log.debug("redis_close_failed", exc_info=True)
