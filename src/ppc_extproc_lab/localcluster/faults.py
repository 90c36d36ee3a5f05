"""Engine crashes on a running :class:`LocalCluster`, measured the way a client sees them.

Two faults, each returning a report the reliability tests assert on and
``benchmarks/bench_faults.py`` prints:

* :func:`kill_under_traffic` — SIGKILL one engine while clients send requests through Envoy.
  Counts the requests lost (any status but 200) and the ones the service still sent to the dead
  engine after the first failure; then restarts it and times until it serves again.
* :func:`restart_staleness` — cache a prefix on one engine, crash and restart it (empty cache,
  event sequence back to 0), then send that prefix again. A prediction of cached tokens on the
  restarted engine before it has served the prefix again is *stale*; the report gives how many
  there were and how long after the engine came back the last one was made.

Requests are token-id completions over plain HTTP (``urllib``) with a timeout on every call.
"""

from __future__ import annotations

import json
import random
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from ppc_extproc_lab.localcluster.cluster import LocalCluster
from ppc_extproc_lab.localcluster.readiness import wait_for

__all__ = ["EngineDeath", "Outcome", "RestartStaleness", "kill_under_traffic", "restart_staleness"]

_TIMEOUT = 10.0


@dataclass(frozen=True, slots=True)
class Outcome:
    """One request through Envoy."""

    request_id: str
    #: Monotonic send time.
    sent: float
    status: int
    #: The engine that answered (its ``x-mock-vllm-endpoint``), None when none did.
    served: str | None
    #: The engine's reported ``cached_tokens``.
    cached_tokens: int | None


@dataclass(frozen=True, slots=True)
class EngineDeath:
    victim: str
    clients: int
    #: Requests sent while the victim was dead (from the kill to its restart).
    sent_while_dead: int
    #: Requests that did not get a 200, and those the service sent to the victim after the first.
    lost: int
    routed_to_dead_after_first_failure: int
    #: Kill → the service holds the victim down (``/debug/state``).
    seconds_to_unroutable: float
    #: Engine ready again → its first served request.
    seconds_to_serving_again: float


@dataclass(frozen=True, slots=True)
class RestartStaleness:
    victim: str
    prefix_tokens: int
    #: Predictions of the prefix on the restarted engine before it served the prefix again:
    #: routed requests (from ``/debug/decisions``) and ``/debug/score`` probes.
    stale_predictions: int
    probes: int
    #: Engine ready again → the last stale prediction (0.0 when there was none).
    stale_window_seconds: float
    #: Engine ready again → the service routes to it.
    seconds_to_routable: float


class _Client:
    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.model = cluster.model

    def complete(self, tokens: list[int], request_id: str) -> Outcome:
        body = json.dumps({"model": self.model, "prompt": tokens, "max_tokens": 2}).encode()
        request = urllib.request.Request(
            self.cluster.listener_url + "/v1/completions",
            data=body,
            headers={"content-type": "application/json", "x-request-id": request_id},
        )
        sent = time.monotonic()
        try:
            with urllib.request.urlopen(request, timeout=_TIMEOUT) as response:
                answer = json.loads(response.read())
                details = (answer.get("usage") or {}).get("prompt_tokens_details") or {}
                return Outcome(request_id, sent, response.status, response.headers.get("x-mock-vllm-endpoint"),
                               details.get("cached_tokens"))  # fmt: skip
        except urllib.error.HTTPError as exc:
            exc.read()
            return Outcome(request_id, sent, exc.code, exc.headers.get("x-mock-vllm-endpoint"), None)
        except OSError:
            return Outcome(request_id, sent, 0, None, None)

    def admin(self, path: str, body: dict[str, Any] | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        with urllib.request.urlopen(self.cluster.admin_url + path, data=data, timeout=_TIMEOUT) as response:
            return json.loads(response.read())

    def decision(self, request_id: str) -> dict[str, Any] | None:
        found = self.admin(f"/debug/decisions?request_id={request_id}")["decisions"]
        return found[-1] if found else None

    def down(self) -> dict[str, list[str]]:
        down: dict[str, list[str]] = self.admin("/debug/state")["health"]["down"]
        return down

    def kv_disconnected(self) -> list[str]:
        lost: list[str] = self.admin("/debug/state")["health"]["kvDisconnected"]
        return lost

    def predicted_blocks(self, tokens: list[int]) -> dict[str, int]:
        """Per routable endpoint, the blocks of ``tokens`` the service would count as cached."""
        answer = self.admin("/debug/score", {"model": self.model, "prompt": tokens})
        return {e["endpoint"]: int(e["matchBlocks"]) for e in answer["endpoints"]}


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(1, 150_000) for _ in range(n)]


def kill_under_traffic(
    cluster: LocalCluster,
    victim: int,
    *,
    clients: int = 1,
    before: int = 20,
    while_dead: int = 60,
    seed: int = 0,
) -> EngineDeath:
    """Kill engine ``victim`` while ``clients`` threads send requests with distinct prompts;
    restart it after ``while_dead`` more requests and wait until it serves one."""
    client = _Client(cluster)
    endpoint = cluster.engine_endpoints[victim]
    outcomes: list[Outcome] = []
    lock = threading.Lock()
    stop = threading.Event()

    def traffic(worker: int) -> None:
        rng = random.Random(seed * 1000 + worker)
        i = 0
        while not stop.is_set():
            outcome = client.complete(_tokens(rng, 64), f"fault-{seed}-{worker}-{i}")
            i += 1
            with lock:
                outcomes.append(outcome)

    def count() -> int:
        with lock:
            return len(outcomes)

    threads = [threading.Thread(target=traffic, args=(w,), daemon=True) for w in range(clients)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: count() >= before, what=f"{before} requests before the kill")
        killed = time.monotonic()
        cluster.kill_engine(victim)
        wait_for(lambda: endpoint in client.down(), what=f"{endpoint} held down")
        unroutable = time.monotonic() - killed
        wait_for(lambda: sum(o.sent >= killed for o in outcomes) >= while_dead, what="traffic while dead")
        restarting = time.monotonic()
        cluster.start_engine(victim)
        ready = time.monotonic()
        wait_for(lambda: any(o.served == endpoint and o.sent >= ready for o in outcomes),
                 what=f"{endpoint} serving again", timeout=60)  # fmt: skip
        serving = min(o.sent for o in outcomes if o.served == endpoint and o.sent >= ready)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=_TIMEOUT + 5)
    failed = [o for o in outcomes if o.status != 200]
    first_failure = min((o.sent for o in failed), default=None)
    routed_to_dead = 0
    if first_failure is not None:
        for o in outcomes:
            if first_failure < o.sent < restarting:
                decision = client.decision(o.request_id)
                routed_to_dead += decision is not None and decision["destination"] == endpoint
    return EngineDeath(
        victim=endpoint,
        clients=clients,
        sent_while_dead=sum(killed <= o.sent < restarting for o in outcomes),
        lost=len(failed),
        routed_to_dead_after_first_failure=routed_to_dead,
        seconds_to_unroutable=unroutable,
        seconds_to_serving_again=max(0.0, serving - ready),
    )


def restart_staleness(
    cluster: LocalCluster, *, prefix_blocks: int = 16, probes: int = 40, seed: int = 0
) -> RestartStaleness:
    """Cache a prefix on the engine that serves it, crash and restart that engine, then send the
    prefix (and score it) ``probes`` times, from the moment the engine is ready again."""
    client = _Client(cluster)
    block = cluster.block_size or 16
    rng = random.Random(seed)
    prefix = _tokens(rng, prefix_blocks * block)
    first = client.complete(prefix + _tokens(rng, 5), f"stale-{seed}-warm")
    if first.served is None:
        raise RuntimeError(f"warm-up request failed with status {first.status}")
    endpoint = first.served
    victim = cluster.engine_endpoints.index(endpoint)
    wait_for(lambda: client.predicted_blocks(prefix).get(endpoint, 0) >= prefix_blocks, what="prefix indexed")
    cluster.kill_engine(victim)
    # No request goes to it meanwhile: its subscriber's lost connection is what the service sees.
    wait_for(lambda: endpoint in client.kv_disconnected(), what=f"{endpoint}'s KV subscriber disconnected")
    cluster.start_engine(victim)
    ready = time.monotonic()
    stale: list[float] = []
    routable_at: float | None = None
    served_prefix_at: float | None = None  # the restarted engine holds the prefix again from here
    for i in range(probes):
        now = time.monotonic()
        blocks = client.predicted_blocks(prefix)
        if endpoint in blocks and routable_at is None:
            routable_at = now
        if blocks.get(endpoint, 0) > 0 and served_prefix_at is None:
            stale.append(now)
        outcome = client.complete(prefix + _tokens(rng, 5), f"stale-{seed}-{i}")
        decision = client.decision(outcome.request_id)
        if decision is not None and decision["destination"] == endpoint:
            if (decision["cachedTokensPredicted"] or 0) > 0 and served_prefix_at is None:
                stale.append(outcome.sent)
            if outcome.served == endpoint and served_prefix_at is None:
                served_prefix_at = time.monotonic()
    if routable_at is None:
        wait_for(lambda: endpoint not in client.down(), what=f"{endpoint} routable again")
        routable_at = time.monotonic()
    return RestartStaleness(
        victim=endpoint,
        prefix_tokens=len(prefix),
        stale_predictions=len(stale),
        probes=probes,
        stale_window_seconds=max((t - ready for t in stale), default=0.0),
        seconds_to_routable=max(0.0, routable_at - ready),
    )
