"""In-flight requests per endpoint in the store, read on the routing path (``redis-syncer``).

Each replica keeps its own requests per endpoint in a hash ``<prefix>:n:<replica id>`` (expiring
after ``stateTTL`` unless refreshed, listed in the set ``<prefix>:replicas``). The claim script
reads every live replica's hash and counts the decision's own answer in the same atomic step, so
a decision sees every decision the store ordered before it, whichever replica made it.

This replica writes its hash as deltas (``HINCRBY``, on the immediate connection, with the change's
``PUBLISH``): a decision the script already counted is not counted again when the request starts
locally. Deltas commute with the scripts' increments, so the order of the two connections does not
matter. After anything that leaves the store's copy unknown (the store back, a claim whose reply
never came, a write that could not go out), the whole hash is rewritten from the local counts.
"""

from __future__ import annotations

from collections.abc import Mapping

from ppc_extproc.ids import EndpointId

__all__ = ["REWRITE_SCRIPT", "OwnCounts"]

#: KEYS: the hash; ARGV: endpoint, requests, …. Replaces the hash's fields in one step (a claim
#: script running between a DEL and an HSET would read nothing).
REWRITE_SCRIPT = b"""
redis.call('DEL', KEYS[1])
if #ARGV > 0 then redis.call('HSET', KEYS[1], unpack(ARGV)) end
return 0
"""


class OwnCounts:
    """What this replica has told the store about its own requests per endpoint."""

    def __init__(self, key: str, replicas_key: str, ttl_ms: int) -> None:
        self.key = key
        self.replicas_key = replicas_key
        self.ttl_ms = ttl_ms
        #: The store's copy of this replica's hash, as far as this replica knows.
        self._told: dict[EndpointId, int] = {}
        #: Decisions the claim script counted (on that endpoint) whose local start is still to come.
        self._counted: dict[EndpointId, int] = {}
        #: Claim scripts sent whose reply has not been handled: a rewrite now could erase their count.
        self.outstanding = 0
        #: The store's copy is unknown: the next write with no claim outstanding rewrites it whole.
        self.resync = True

    def sent(self) -> None:
        """A counting claim script went out."""
        self.outstanding += 1

    def answered(self, endpoint: EndpointId | None) -> None:
        """Its reply: the script counted one request on ``endpoint`` (its local start follows at
        once), or None: no reply (timeout, error), so the store's copy is unknown."""
        self.outstanding = max(0, self.outstanding - 1)
        if endpoint is None:
            self.resync = True
        else:
            self._counted[endpoint] = self._counted.get(endpoint, 0) + 1

    def lost(self) -> None:
        """Commands from ``commands`` could not be sent."""
        self.resync = True

    def commands(self, local: Mapping[EndpointId, int], *, heartbeat: bool = False) -> list[tuple[bytes, ...]]:
        """Commands (argument tuples) that bring the store's hash to ``local`` (this replica's requests per
        endpoint), assuming they are sent (else call ``lost``). On a heartbeat, or after ``lost``
        / an unanswered claim, and when no claim is outstanding, the whole hash is rewritten."""
        for ep, n in self._counted.items():
            self._told[ep] = self._told.get(ep, 0) + n
        self._counted.clear()
        key = self.key.encode()
        out: list[tuple[bytes, ...]] = []
        if (self.resync or heartbeat) and not self.outstanding:
            flat = [part for ep, n in local.items() if n for part in (ep.encode(), b"%d" % n)]
            out.append((b"EVAL", REWRITE_SCRIPT, b"1", key, *flat))
            self.resync = False
            heartbeat = True
        else:
            for ep in {*self._told, *local}:
                delta = local.get(ep, 0) - self._told.get(ep, 0)
                if delta:
                    out.append((b"HINCRBY", key, ep.encode(), b"%d" % delta))
        self._told = {ep: n for ep, n in local.items() if n}
        if out or heartbeat:
            out.append((b"PEXPIRE", key, b"%d" % self.ttl_ms))
        if heartbeat:
            out.append((b"SADD", self.replicas_key.encode(), key))
        return out
