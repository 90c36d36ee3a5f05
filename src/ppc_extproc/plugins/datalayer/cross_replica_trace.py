"""A bounded log of one replica's in-flight counts over time, for measuring the cross-replica error.

Each entry is stamped with ``time.monotonic()`` (``CLOCK_MONOTONIC``: one clock for every process
on a Linux machine), so a benchmark can merge the logs of several replicas and compute, at any
instant, each replica's view (its own counts + the peers' counts it holds) against the true sum of
every replica's own counts — without the skew of scraping the replicas one after another.

Kinds: ``own`` (this replica's requests per endpoint after a change), ``peers`` (the other
replicas' requests per endpoint, as they reach this replica in the background), ``decision`` (a
routing decision: every replica's requests per endpoint as the decision read them — from the claim
script's reply, stamped when the script was sent, or else this replica's own + peers' view when it
reached the syncer), ``commit`` (a decision the claim script counted in the store: ``{endpoint:
when the script was sent}``, logged just before the request starts locally, so that a reader can
count it from the store's instant). Off (``traceSize: 0``) by default; ``/debug/state`` shows it.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Mapping

from ppc_extproc.ids import EndpointId

__all__ = ["InflightTrace"]


class InflightTrace:
    """At most ``size`` entries ``(kind, monotonic seconds, {endpoint: requests})``, oldest dropped."""

    def __init__(self, size: int) -> None:
        self.entries: deque[tuple[str, float, dict[str, float]]] = deque(maxlen=max(1, size))

    def own(self, counts: Mapping[EndpointId, tuple[int, int]]) -> None:
        self.entries.append(("own", time.monotonic(), {ep: n for ep, (n, _) in counts.items() if n}))

    def peers(self, counts: Mapping[EndpointId, tuple[int, int]]) -> None:
        self.entries.append(("peers", time.monotonic(), {ep: n for ep, (n, _) in counts.items() if n}))

    def decision(self, at: float, view: Mapping[EndpointId, int]) -> None:
        """A decision that read ``view`` (requests per endpoint, every replica's) at ``at``."""
        self.entries.append(("decision", at, {ep: n for ep, n in view.items() if n}))

    def commit(self, sent: float, endpoint: EndpointId) -> None:
        """The claim script sent at ``sent`` counted this decision on ``endpoint`` in the store."""
        self.entries.append(("commit", time.monotonic(), {endpoint: sent}))

    def to_json(self) -> list[list[object]]:
        return [[kind, at, counts] for kind, at, counts in list(self.entries)]
