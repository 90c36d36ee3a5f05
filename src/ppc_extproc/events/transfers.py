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

Entries expire (``ttl_seconds``) and are bounded per engine and in total: a transfer never
confirmed (a failed request, an engine that never generated a whole block) is simply forgotten.
Thread-safe: the request path records, the ingestion thread reads and takes.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from ppc_extproc.ids import EndpointId, RequestKey

__all__ = ["Transfer", "TransferLedger"]

#: Long enough for a decode engine to generate its first whole block under load.
DEFAULT_TTL_SECONDS = 120.0
MAX_PER_ENDPOINT = 256
MAX_ENDPOINTS = 4096


@dataclass(slots=True)
class Transfer:
    """One disaggregated request's prompt, as its decode engine should now hold it."""

    #: The prefill endpoint that computed the blocks, and its data-parallel rank.
    source: EndpointId
    source_rank: int
    #: Request keys of the prompt's full canonical blocks.
    keys: list[RequestKey]
    #: Prompt tokens.
    n_tokens: int
    #: The decode engine's block size assumed for ``tail`` (its learned size, else the canonical).
    engine_block: int
    #: Prompt token ids (LE32) after its last full engine block: a generated block's first tokens.
    tail: bytes
    created: float = 0.0


class TransferLedger:
    """Pending transfers per decode endpoint, newest last."""

    def __init__(
        self,
        ttl_seconds: float = DEFAULT_TTL_SECONDS,
        max_per_endpoint: int = MAX_PER_ENDPOINT,
        max_endpoints: int = MAX_ENDPOINTS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl_seconds = ttl_seconds
        self.max_per_endpoint = max_per_endpoint
        self.max_endpoints = max_endpoints
        self.clock = clock
        self._pending: OrderedDict[EndpointId, list[Transfer]] = OrderedDict()
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
                    self.evicted += len(dropped)
                pending = self._pending[target] = []
            pending.append(transfer)
            if len(pending) > self.max_per_endpoint:
                del pending[0]
                self.evicted += 1

    def pending(self, target: str) -> list[Transfer]:
        """``target``'s unexpired transfers, oldest first (a copy)."""
        with self._lock:
            pending = self._pending.get(EndpointId(target))
            if not pending:
                return []
            horizon = self.clock() - self.ttl_seconds
            if pending[0].created < horizon:
                pending[:] = [t for t in pending if t.created >= horizon]
            return list(pending)

    def take(self, target: str, transfer: Transfer) -> bool:
        """Remove one transfer (confirmed, or its request failed); False when already gone."""
        with self._lock:
            pending = self._pending.get(EndpointId(target))
            if pending is None:
                return False
            for i, candidate in enumerate(pending):
                if candidate is transfer:
                    del pending[i]
                    if not pending:
                        del self._pending[EndpointId(target)]
                    return True
            return False

    def forget(self, target: str) -> None:
        """The engine was cleared or left the pool."""
        with self._lock:
            self._pending.pop(EndpointId(target), None)

    def expire(self, now: float) -> None:
        horizon = now - self.ttl_seconds
        with self._lock:
            for target in [t for t, p in self._pending.items() if p and p[0].created < horizon]:
                kept = [t for t in self._pending[target] if t.created >= horizon]
                if kept:
                    self._pending[target] = kept
                else:
                    del self._pending[target]

    def __len__(self) -> int:
        with self._lock:
            return sum(len(p) for p in self._pending.values())
