"""KV blocks a decode engine received from a prefill engine (P/D disaggregation), until its own
KV events confirm them.

A decode engine fed over the wire (NIXL) stores the prompt's blocks without a BlockStored for them
(llm-d/llm-d-kv-cache issue #372). Its first BlockStored is for a generated block, and it names the
last transferred block as its parent — a hash the indexer never saw on that engine, so the event
would be dropped as ``unknown_parent`` and the conversation's next turn would look uncached there.
The router knows better: it sent the request. Each disaggregated request leaves a ``Transfer``
here (the prompt's request keys, its prefill endpoint, the prompt tail after the decode engine's
last full block), and the event applier asks ``pending`` when a decode engine's parent is unknown:

    exact       the parent is an engine key the prefill endpoint stored (engines hashing alike,
                e.g. a shared ``PYTHONHASHSEED``): its request key is one of the transfer's
    by tokens   otherwise the one pending transfer whose prompt tail starts the event's tokens
                (the generated block completes the prompt's partial block), when exactly one fits

Entries expire (``ttl_seconds``) and are bounded per engine, in engines, and in request keys held
over all of them (the request's own key list, kept without a copy: about 44 bytes a key, so the
default 1M is some 44 MB), the oldest dropped first: a transfer
never confirmed (a failed request, an engine that never generated a whole block) is simply
forgotten. Thread-safe: the request path records, the ingestion thread reads and takes.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ppc_extproc.ids import EndpointId, RequestKey

__all__ = ["Transfer", "TransferLedger"]

#: Long enough for a decode engine to generate its first whole block under load.
DEFAULT_TTL_SECONDS = 120.0
MAX_PER_ENDPOINT = 256
MAX_ENDPOINTS = 4096
MAX_KEYS = 1_000_000


@dataclass(slots=True)
class Transfer:
    """One disaggregated request's prompt, as its decode engine should now hold it."""

    #: The prefill endpoint that computed the blocks, and its data-parallel rank.
    source: EndpointId
    source_rank: int
    #: Request keys of the prompt's full canonical blocks (the request's list, not copied: a
    #: copy would cost the request path more than the rest of the P/D decision).
    keys: Sequence[RequestKey]
    #: Prompt tokens.
    n_tokens: int
    #: The decode engine's block size assumed for ``tail`` (its learned size, else the canonical).
    engine_block: int
    #: Prompt token ids (LE32) after its last full engine block: a generated block's first tokens.
    tail: bytes
    created: float = 0.0
    #: False once taken, forgotten, expired or evicted.
    live: bool = field(default=True, compare=False)


class TransferLedger:
    """Pending transfers per decode endpoint, newest last."""

    def __init__(
        self,
        ttl_seconds: float = DEFAULT_TTL_SECONDS,
        max_per_endpoint: int = MAX_PER_ENDPOINT,
        max_endpoints: int = MAX_ENDPOINTS,
        clock: Callable[[], float] = time.monotonic,
        max_keys: int = MAX_KEYS,
    ) -> None:
        self.ttl_seconds = ttl_seconds
        self.max_per_endpoint = max_per_endpoint
        self.max_endpoints = max_endpoints
        self.max_keys = max_keys
        self.clock = clock
        self._pending: OrderedDict[EndpointId, list[Transfer]] = OrderedDict()
        #: Every recorded transfer in order (dead ones are skipped when evicting).
        self._order: deque[tuple[EndpointId, Transfer]] = deque()
        self._keys = 0
        self._lock = threading.Lock()
        #: Transfers dropped by a bound before they expired.
        self.evicted = 0

    def record(self, target: EndpointId, transfer: Transfer) -> None:
        transfer.created = self.clock()
        with self._lock:
            pending = self._pending.get(target)
            if pending is None:
                if len(self._pending) >= self.max_endpoints:
                    _, dropped = self._pending.popitem(last=False)
                    self._drop(dropped, evicted=True)
                pending = self._pending[target] = []
            pending.append(transfer)
            self._order.append((target, transfer))
            self._keys += len(transfer.keys)
            if len(pending) > self.max_per_endpoint:
                self._drop([pending.pop(0)], evicted=True)
            while self._keys > self.max_keys and self._order:
                old_target, old = self._order.popleft()
                if old.live and old is not transfer:
                    self._remove(old_target, old, evicted=True)
            if len(self._order) > 4 * (len(self) + 1):  # compact the dead entries away
                self._order = deque(e for e in self._order if e[1].live)

    def _drop(self, transfers: list[Transfer], *, evicted: bool = False) -> None:
        """(Lock held.) Mark ``transfers`` gone (already out of their engine's list)."""
        for t in transfers:
            if t.live:
                t.live = False
                self._keys -= len(t.keys)
                self.evicted += evicted

    def _remove(self, target: EndpointId, transfer: Transfer, *, evicted: bool = False) -> bool:
        """(Lock held.) Take ``transfer`` out of ``target``'s list."""
        pending = self._pending.get(target)
        if pending is None:
            return False
        for i, candidate in enumerate(pending):
            if candidate is transfer:
                del pending[i]
                if not pending:
                    del self._pending[target]
                self._drop([transfer], evicted=evicted)
                return True
        return False

    def pending(self, target: str) -> list[Transfer]:
        """``target``'s unexpired transfers, oldest first (a copy)."""
        with self._lock:
            pending = self._pending.get(EndpointId(target))
            if not pending:
                return []
            horizon = self.clock() - self.ttl_seconds
            if pending[0].created < horizon:
                self._drop([t for t in pending if t.created < horizon])
                pending[:] = [t for t in pending if t.live]
            return list(pending)

    def take(self, target: str, transfer: Transfer) -> bool:
        """Remove one transfer (confirmed, or its request failed); False when already gone."""
        with self._lock:
            return self._remove(EndpointId(target), transfer)

    def forget(self, target: str) -> None:
        """The engine was cleared or left the pool."""
        with self._lock:
            self._drop(self._pending.pop(EndpointId(target), []))

    def expire(self, now: float) -> None:
        horizon = now - self.ttl_seconds
        with self._lock:
            for target in [t for t, p in self._pending.items() if p and p[0].created < horizon]:
                self._drop([t for t in self._pending[target] if t.created < horizon])
                kept = [t for t in self._pending[target] if t.live]
                if kept:
                    self._pending[target] = kept
                else:
                    del self._pending[target]

    @property
    def keys_held(self) -> int:
        """Request keys the pending transfers hold."""
        return self._keys

    def __len__(self) -> int:
        return sum(len(p) for p in list(self._pending.values()))
