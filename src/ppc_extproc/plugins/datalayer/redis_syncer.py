"""``redis-syncer``: several router replicas route as one through a shared Valkey or Redis.

Type        ``redis-syncer`` (cross-replica syncer; ``redis-state-store``, llm-d's older name, is an alias),
            referenced by ``dataLayer.crossReplicaSyncerPluginRef``
Shares      * in-flight requests and uncached prompt tokens per endpoint: every replica publishes
              its own counts on each change and every ``crossReplicaSyncInterval``; load scorers
              read local + the other replicas' counts; no wait on the routing path.
              ``changePublish: immediate``: the change is written on a dedicated connection by the
              decision itself (``cross_replica_pubsub``); ``coalesced``: by a background task,
              one message per 2 ms
            * speculative entries, as prefix claims: after the local pick, one atomic script
              (one round trip) reads who already claimed this prompt's prefix; a deeper claim
              by an allowed endpoint wins over the pick, and the prefix is claimed for the answer
              (``claimPrefixes: false``: no round trip on the routing path, in-flight only)
            * ``claimCounts`` (default): the same script reads every replica's in-flight requests
              per endpoint from the store and counts the answer there, so the decision sees
              every decision the store ordered before it (``cross_replica_counts``); a cold
              prompt (no allowed endpoint holds a block) that nobody claimed goes, in that same
              step, to the allowed endpoint with the fewest requests, the local ranking breaking
              ties, and is claimed there. Warm prompts keep the claim's or the local pick (their
              prefix outweighs load, as in one replica)
            * ``coldPlacement: rendezvous``: a prompt of which no allowed endpoint holds a block
              goes, without a round trip, to the highest-rendezvous-hash endpoint of its first block
              key (so every replica routing its siblings at once agrees), as does a pick that
              already is that endpoint; the claim is then written in the background. Other
              prompts wait for the claim as above. Blind to load for those cold prompts.
            The KV index is not shared: each replica subscribes to every engine's events.
Failure     the store is an optimisation. Every call has a timeout (``claimTimeout`` on the
            routing path, ``crossReplicaPublishTimeout`` in the background); on an error the
            replica routes on local state, with no failed request: peers' counts are dropped
            until the subscription and a publish succeed again, and after 3 claims in a row
            fail claims are skipped for one sync interval. Re-subscribes every
            ``min(crossReplicaSyncInterval, 100ms)``, publishes at once, and publishes again on
            hearing a replica it had not (so both sides know each other within a round trip).
Consumes    the block keys and match info of ``prefixMatchInfoProducerName``
            [precise-prefix-cache-producer] (claims need its keys)
Parameters  ``address`` ["localhost:6379"; also ``redis://host:port/db``], ``passwordEnv`` |
            ``passwordFile`` (a plaintext ``password`` is refused), ``db`` [0], ``stateTTL``
            ["2s": a replica silent this long stops counting], ``coordinationTTL`` [accepted,
            unused], ``claimTTL`` ["2s": the speculative TTL], ``claimPrefixes`` [true],
            ``claimTimeout`` ["20ms"], ``keyPrefix`` ["ppc-extproc"], ``prefixMatchInfoProducerName``,
            ``coldPlacement`` [claim | rendezvous], ``changePublish`` [immediate | coalesced],
            ``claimCounts`` [true],
            ``traceSize`` [0: off; ≤ 1,000,000 entries of
            this replica's own and peers' in-flight counts, stamped, in ``/debug/state``]
Keys        ``<keyPrefix>:c:<block key>`` strings expiring after ``claimTTL`` (≤ 24 per request),
            ``<keyPrefix>:n:<replica>`` hashes (requests per endpoint, expiring after ``stateTTL``),
            the set ``<keyPrefix>:replicas``, channel ``<keyPrefix>:inflight``. Standalone Valkey ≥ 7.2 or Redis ≥ 7.0.
Metrics     ``ppc_extproc_cross_replica_store_up``, ``…_peers``, ``…_sync_total{outcome}``,
            ``…_claims_total{outcome}`` (adopted, kept, timeout, error, skipped, rendezvous,
            placed: a cold prompt moved to the least-loaded endpoint by the store's counts)

    plugins:
    - type: redis-syncer
      parameters: {address: "valkey:6379", stateTTL: 2s}
    dataLayer:
      crossReplicaSyncerPluginRef: redis-syncer
      crossReplicaSyncInterval: 200ms
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import structlog

from ppc_extproc.errors import ConfigError
from ppc_extproc.framework import (
    PREFIX_CACHE_MATCH_INFO,
    CrossReplicaStats,
    CrossReplicaSyncer,
    Endpoint,
    Lifecycle,
    PluginState,
    SchedulingContext,
    SchedulingResult,
    StateReporter,
)
from ppc_extproc.framework.params import Section
from ppc_extproc.ids import EndpointId, RequestKey
from ppc_extproc.plugins.datalayer.cross_replica_counts import OwnCounts
from ppc_extproc.plugins.datalayer.cross_replica_placement import cold_home, is_cold, moved_to
from ppc_extproc.plugins.datalayer.cross_replica_pubsub import ImmediatePublisher
from ppc_extproc.plugins.datalayer.cross_replica_store import (
    PeerLoad,
    RedisStore,
    claim_positions,
    encode_load,
)
from ppc_extproc.plugins.datalayer.cross_replica_trace import InflightTrace
from ppc_extproc.plugins.datalayer.redis_syncer_config import parse_syncer_config
from ppc_extproc.plugins.producers.precise_prefix_cache import PRECISE_BLOCK_KEYS
from ppc_extproc.plugins.registry import Services, register
from ppc_extproc.scheduling.inflight import InflightTracker

__all__ = ["RedisSyncer"]

log = structlog.get_logger(__name__)

CLAIM_OUTCOMES = ("adopted", "kept", "timeout", "error", "skipped", "rendezvous", "placed")
SYNC_OUTCOMES = ("ok", "error")
#: Consecutive claim failures after which claims wait for the subscription to come back.
_CLAIM_FAILURES_OPEN = 3
_MIN_PUSH_INTERVAL = 0.002
#: ``changePublish: immediate``: at most one message per this interval on the immediate path.
_MIN_IMMEDIATE_INTERVAL = 0.0002
#: Background claims (``coldPlacement: rendezvous``) in flight at most; more are skipped.
_MAX_BACKGROUND_CLAIMS = 64


@dataclass(slots=True)
class _Read:
    """What one decision read, for the trace: when, and every replica's requests per endpoint."""

    at: float
    view: dict[EndpointId, int]
    committed: bool = False


@register("redis-syncer")
class RedisSyncer(CrossReplicaSyncer, Lifecycle, StateReporter):
    """Shares in-flight load and prefix claims with the other replicas through one store."""

    def __init__(
        self, name: str, store: RedisStore, inflight: InflightTracker, *, state_ttl: float, claim_ttl: float,
        claim_prefixes: bool, claim_timeout: float, producer: str, clock: Callable[[], float] = time.monotonic,
        cold_placement: str = "claim", trace_size: int = 0, immediate: ImmediatePublisher | None = None,
        claim_counts: bool = True,
    ) -> None:
        self.name = name
        self.store = store
        self.inflight = inflight
        self.clock = clock
        self.claim_ttl_ms = max(1, int(claim_ttl * 1000))
        self.claim_prefixes = claim_prefixes
        self.claim_timeout = claim_timeout
        #: ``rendezvous``: a prompt no endpoint holds goes to the rendezvous-hash endpoint of its first
        #: block (every replica agrees without a round trip) and is claimed in the background.
        self.rendezvous = cold_placement == "rendezvous"
        self.trace = InflightTrace(trace_size) if trace_size > 0 else None
        self._background: set[asyncio.Task[None]] = set()
        #: ``changePublish: immediate``: changes written on this connection from the decision itself.
        self.immediate = immediate
        self._last_immediate = 0.0
        self._immediate_retry_at = 0.0
        self._seq = 0
        self.keys_key = PRECISE_BLOCK_KEYS.of(producer)
        self.match_key = PREFIX_CACHE_MATCH_INFO.of(producer)
        self.replica_id = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.peers = PeerLoad(self.replica_id, state_ttl)
        #: ``claimCounts``: the claim script reads and counts in-flight requests in the store.
        self.claim_counts = claim_counts
        self.counts = OwnCounts(store.own_counts_key(self.replica_id), store.replicas_key, max(1, int(state_ttl * 1000)))
        self.sync_interval = 0.2
        self.publish_timeout = 1.0
        #: True while subscribed and the last publish succeeded: claims run only then.
        self.up = False
        self._subscribed = False
        #: Claims are skipped until this time (``clock``) after consecutive failures.
        self._claims_closed_until = 0.0
        self.claims: Counter[str] = Counter({o: 0 for o in CLAIM_OUTCOMES})
        self.syncs: Counter[str] = Counter({o: 0 for o in SYNC_OUTCOMES})
        self._claim_failures = 0
        self._dirty = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False

    @classmethod
    def from_parameters(cls, name: str, params: Section, services: Services) -> RedisSyncer:
        c = parse_syncer_config(params)
        try:
            store = RedisStore(c.host, c.port, db=c.db, password=c.password, prefix=c.key_prefix, timeout_seconds=1.0)
        except ImportError:
            raise ConfigError(params.path, "redis-syncer needs redis-py: pip install 'ppc-extproc[shared-state]'") from None
        immediate = ImmediatePublisher(c.host, c.port, c.password, store.channel) if c.change_publish == "immediate" else None
        return cls(name, store, services.inflight, state_ttl=c.state_ttl, claim_ttl=c.claim_ttl,
                   claim_prefixes=c.claim_prefixes, claim_timeout=c.claim_timeout, producer=c.producer,
                   clock=services.clock, cold_placement=c.cold_placement, trace_size=c.trace_size,
                   immediate=immediate, claim_counts=c.claim_counts)  # fmt: skip

    # --- configuration and lifecycle ------------------------------------------------------------

    def configure(self, sync_interval_seconds: float, publish_timeout_seconds: float) -> None:
        self.sync_interval = sync_interval_seconds if sync_interval_seconds > 0 else 0.2
        self.publish_timeout = publish_timeout_seconds if publish_timeout_seconds > 0 else 1.0
        self.store.timeout_seconds = self.publish_timeout

    async def start(self) -> None:
        """Start the background publish and subscribe tasks; never waits for the store."""
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self.inflight.on_change = self._changed
        self._tasks = [
            asyncio.create_task(self._subscribe_loop(), name=f"{self.name}-subscribe"),
            asyncio.create_task(self._publish_loop(), name=f"{self.name}-publish"),
        ]

    async def stop(self) -> None:
        self.inflight.on_change = None
        self._stopping = True
        self._dirty.set()
        # Cancel until done: a cancellation that races a completing ``wait_for`` can be lost
        # (CPython 3.11, gh-86296); the loops also check ``_stopping``.
        pending = set(self._tasks)
        for _ in range(50):
            if not pending:
                break
            for task in pending:
                task.cancel()
            _, pending = await asyncio.wait(pending, timeout=0.1)
        self._tasks = []
        for task in list(self._background):
            task.cancel()
        if self._background:
            await asyncio.wait(self._background, timeout=1.0)
        self.up = False
        self._go_local()
        if self.immediate is not None:
            await self.immediate.aclose()
        await self.store.close()

    def _changed(self) -> None:
        if self.trace is not None:
            self.trace.own(self.inflight.local_snapshot())
        if threading.get_ident() == self._loop_thread:
            if not self._publish_immediately():
                self._dirty.set()
        elif self._loop is not None:
            try:
                self._loop.call_soon_threadsafe(self._dirty.set)
            except RuntimeError:  # the loop is closed: the service is stopping
                pass

    def _publish_immediately(self) -> bool:
        """Write this replica's counts now on the immediate connection (True), unless it is down or
        the last such message went out less than ``_MIN_IMMEDIATE_INTERVAL`` ago (the store's
        hash gets its change at once all the same)."""
        publisher = self.immediate
        if publisher is None or not self.up or not publisher.connected:
            self.counts.lost()
            return False
        now = time.monotonic()
        commands = self._count_commands(heartbeat=False)
        payload = self._payload() if now - self._last_immediate >= _MIN_IMMEDIATE_INTERVAL else None
        if not publisher.publish(payload, commands):
            self.counts.lost()
            return False
        if payload is None:
            return False
        self._last_immediate = now
        self.syncs["ok"] += 1
        return True

    def _count_commands(self, *, heartbeat: bool) -> list[tuple[bytes, ...]]:
        """The writes that bring this replica's hash in the store to its local counts."""
        if not self.claim_counts:
            return []
        return self.counts.commands({ep: n for ep, (n, _) in self.inflight.local_snapshot().items()},
                                    heartbeat=heartbeat)  # fmt: skip

    def _payload(self) -> str:
        self._seq += 1
        return encode_load(self.replica_id, self.inflight.local_snapshot(), self._seq)

    def _go_local(self) -> None:
        """The store failed: route on this replica's own state until it is back."""
        if self.up:
            log.warning("cross_replica_store_down", plugin=self.name)
        self.up = False
        self.counts.lost()
        self.peers.clear()
        self._set_peer_load({})
        if self.immediate is not None:
            self.immediate.close()

    def _mark_up(self) -> None:
        if not self.up:
            log.info("cross_replica_store_up", plugin=self.name)
        self.up = True

    # --- background -----------------------------------------------------------------------------

    async def _subscribe_loop(self) -> None:
        retry = min(self.sync_interval, 0.1)
        while not self._stopping:
            try:
                await self.store.subscribe(self._on_message, self._on_subscribed, poll_seconds=self.sync_interval,
                                           running=lambda: not self._stopping)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if not self.store.is_store_error(exc):
                    log.exception("cross_replica_subscribe_failed", plugin=self.name)
            self._subscribed = False
            self._go_local()
            await asyncio.sleep(retry)

    async def _on_subscribed(self) -> None:
        self._subscribed = True
        await self.store.drop_idle_connections()  # claims and publishes then meet the live server
        if self.immediate is not None:
            try:  # a fresh connection: the pool's may still be the dead server's (one failure each)
                await self.immediate.connect(self.publish_timeout)
            except (OSError, TimeoutError, ConnectionError):
                log.warning("cross_replica_immediate_publish_unavailable", plugin=self.name)
        await self._publish()  # peers learn our counts at once; theirs arrive within one interval
        self._claim_failures = 0
        self._mark_up()

    def _on_message(self, data: bytes) -> None:
        if self.peers.receive(data):
            self._set_peer_load(self.peers.aggregate())
            if self.peers.new_peer:  # a replica that just (re)subscribed hears our counts at once
                self._dirty.set()
                log.info("cross_replica_peer_seen", plugin=self.name, peers=self.peers.live())

    def _set_peer_load(self, counts: dict[EndpointId, tuple[int, int]]) -> None:
        self.inflight.set_peer_load(counts)
        if self.trace is not None:
            self.trace.peers(counts)

    async def _publish_loop(self) -> None:
        while not self._stopping:
            try:
                await asyncio.wait_for(self._dirty.wait(), self.sync_interval)
            except TimeoutError:
                pass
            self._dirty.clear()
            if not self._subscribed:  # the store is gone: ``_on_subscribed`` publishes when it is back
                continue
            await self._reconnect_immediate()
            try:
                await self._publish()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if not self.store.is_store_error(exc):
                    log.exception("cross_replica_publish_failed", plugin=self.name)
                self._go_local()
            else:
                if self._subscribed:
                    self._mark_up()
            if self.up:  # ageing: a replica that stopped publishing stops counting
                self._set_peer_load(self.peers.aggregate())
            await asyncio.sleep(_MIN_PUSH_INTERVAL)

    async def _reconnect_immediate(self) -> None:
        """The immediate connection alone was lost (the subscription lives): reopen it, at most
        once per sync interval."""
        publisher = self.immediate
        now = time.monotonic()
        if publisher is None or publisher.connected or now < self._immediate_retry_at:
            return
        self._immediate_retry_at = now + self.sync_interval
        try:
            await publisher.connect(self.publish_timeout)
        except (OSError, TimeoutError, ConnectionError):
            log.debug("cross_replica_immediate_reconnect_failed", plugin=self.name)

    async def _publish(self) -> None:
        """Publish this replica's counts: on the immediate connection when it is up (a store that
        has left writes unanswered for ``crossReplicaPublishTimeout`` fails it), else through
        redis-py, awaiting the reply."""
        try:
            publisher = self.immediate
            if publisher is not None and publisher.connected:
                if publisher.stalled(time.monotonic(), self.publish_timeout):
                    publisher.close()
                    raise TimeoutError("the store left publishes unanswered")
                if publisher.publish(self._payload(), self._count_commands(heartbeat=True)):
                    self.syncs["ok"] += 1
                    return
                self.counts.lost()
            await self.store.publish(self._payload(), self._count_commands(heartbeat=True))
        except BaseException:
            self.counts.lost()
            self.syncs["error"] += 1
            raise
        self.syncs["ok"] += 1

    # --- the routing path -----------------------------------------------------------------------

    async def coordinate(self, ctx: SchedulingContext, result: SchedulingResult) -> SchedulingResult:
        if self.trace is None:
            return await self._coordinate(ctx, result, None)
        read = _Read(time.monotonic(), {e.id: self.inflight.requests(e.id) for e in ctx.candidates})
        out = await self._coordinate(ctx, result, read)
        self.trace.decision(read.at, read.view)
        if read.committed and out.targets:
            self.trace.commit(read.at, out.targets[0].id)
        return out

    async def _coordinate(self, ctx: SchedulingContext, result: SchedulingResult, read: _Read | None) -> SchedulingResult:
        if not self.claim_prefixes or not result.targets:
            return result
        if not self.up or (self._claims_closed_until and self.clock() < self._claims_closed_until):
            self.claims["skipped"] += 1
            return result
        keys_per_prompt = ctx.get(self.keys_key)
        if not keys_per_prompt or not keys_per_prompt[0]:
            return result
        keys = keys_per_prompt[0]
        pick = result.targets[0]
        info = ctx.endpoint_value(pick.id, self.match_key)
        known = info.cached_block_count if info is not None else 0
        if known >= len(keys):  # the pick holds the whole prompt: no claim can beat it
            self.claims["kept"] += 1
            return result
        depths = claim_positions(len(keys))
        scored = result.primary.totals
        allowed = [e for e in ctx.candidates if not scored or e.id in scored]
        claim_keys = [keys[d - 1] for d in depths]
        allowed_ids = [e.id for e in allowed]
        if self.rendezvous and allowed:
            home = cold_home(ctx, result, allowed, keys[0], known, self.match_key)
            if home is not None:  # no wait: the claim goes out in the background
                self.claims["rendezvous"] += 1
                self._claim_later(claim_keys, depths, home.id, allowed_ids)
                return moved_to(result, home)
        count = self.claim_counts
        cold = count and is_cold(ctx, result, allowed, known, self.match_key)
        if cold:  # the store places it by load: the allowed endpoints in the local preference order
            allowed_ids = [pick.id, *sorted((ep for ep in allowed_ids if ep != pick.id),
                                            key=lambda ep: -scored.get(ep, 0.0))]  # fmt: skip
        if count:
            self.counts.sent()
        try:
            async with asyncio.timeout(self.claim_timeout):
                reply = await self.store.claim(claim_keys, depths, pick.id, known, allowed_ids, self.claim_ttl_ms,
                                               count=count, counts_ttl_ms=self.counts.ttl_ms, cold=cold)  # fmt: skip
        except TimeoutError:
            if count:
                self.counts.answered(None)
            return self._claim_failed("timeout", result)
        except Exception as exc:
            if count:
                self.counts.answered(None)
            if not self.store.is_store_error(exc):
                log.exception("cross_replica_claim_failed", plugin=self.name)
            return self._claim_failed("error", result)
        except BaseException:  # cancelled: the script may have run
            if count:
                self.counts.answered(None)
            raise
        self._claim_failures = 0
        self._claims_closed_until = 0.0
        answer = EndpointId(reply.answer)
        if count:
            self.counts.answered(answer)
            if read is not None:  # the decision read the store's counts at the script's instant
                read.at = reply.server_time - (time.time() - time.monotonic())
                read.view, read.committed = reply.requests, True
        if answer == pick.id:
            self.claims["kept"] += 1
            return result
        if cold and reply.depth == 0:  # placed by load: no replica had claimed the prompt
            target = next((e for e in allowed if e.id == answer), None)
            if target is not None:
                self.claims["placed"] += 1
                return moved_to(result, target)
        return self._retarget(result, allowed, answer)

    def _claim_later(self, keys: list[RequestKey], depths: list[int], answer: str, allowed: Sequence[str]) -> None:
        """Claim ``keys`` for ``answer`` off the routing path (bounded; failures count as claims' do)."""
        if len(self._background) >= _MAX_BACKGROUND_CLAIMS:
            return
        task = asyncio.get_running_loop().create_task(self._claim_background(keys, depths, answer, allowed))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _claim_background(self, keys: list[RequestKey], depths: list[int], answer: str,
                                allowed: Sequence[str]) -> None:  # fmt: skip
        try:
            async with asyncio.timeout(max(self.claim_timeout, 0.1)):
                await self.store.claim(keys, depths, answer, depths[-1], allowed, self.claim_ttl_ms)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if not self.store.is_store_error(exc):
                log.exception("cross_replica_claim_failed", plugin=self.name)
            self._count_failure("timeout" if isinstance(exc, TimeoutError) else "error")
        else:
            self._claim_failures = 0

    def _claim_failed(self, outcome: str, result: SchedulingResult) -> SchedulingResult:
        self._count_failure(outcome)
        return result

    def _count_failure(self, outcome: str) -> None:
        self.claims[outcome] += 1
        self._claim_failures += 1
        if self._claim_failures >= _CLAIM_FAILURES_OPEN:  # a slow store: stop waiting on it a while
            self._claims_closed_until = self.clock() + self.sync_interval
            self._claim_failures = 0

    def _retarget(self, result: SchedulingResult, allowed: list[Endpoint], answer: EndpointId) -> SchedulingResult:
        target = next((e for e in allowed if e.id == answer), None)
        if target is None or result.destinations != [t.id for t in result.targets]:
            self.claims["kept"] += 1  # unknown endpoint, or a data-parallel rewrite: keep the pick
            return result
        self.claims["adopted"] += 1
        return moved_to(result, target)

    # --- state ----------------------------------------------------------------------------------

    def state(self, *, detailed: bool = False) -> PluginState:
        stats = CrossReplicaStats(self.up, self.peers.live(), dict(self.claims), dict(self.syncs), self.peers.malformed)
        return PluginState(self.name, self.type_name, cross_replica=stats, details={
            "replicaId": self.replica_id, "up": stats.up, "peers": stats.peers, "claims": stats.claims,
            "syncs": stats.syncs, "peerLoad": {ep: list(v) for ep, v in self.inflight.peer_load().items()},
            **({"inflightTrace": self.trace.to_json()} if self.trace is not None and detailed else {}),
        })  # fmt: skip

