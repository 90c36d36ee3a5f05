"""Multi-turn sessions through several service replicas behind one Envoy, with one engine killed.

:func:`session_cluster_config` is the service config: the embedded default plus a
``session-affinity-scorer`` (weight 20, ``strategy: session_id``, ``placement: fewestBindings``, bindings
shared through the store at ``store_url``, or local with ``None``) and a two-endpoint fallback
list for Envoy's ``override_host`` policy (``envoy-override-host.yaml``).

:func:`run_sessions` sends ``turns`` rounds: round ``t`` is turn ``t`` of every session (a prompt
that extends the previous turn's, header ``x-session-id``), sent by ``clients`` threads. After
round ``kill_after_turn`` it SIGKILLs the engine serving the most sessions — between rounds, so no
request is in flight on it — and the remaining rounds go on. The report says, per session, which
engines served it, and counts non-200 answers.
"""

from __future__ import annotations

import copy
import json
import random
import statistics
import time
import urllib.error
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from ppc_extproc_lab.localcluster.cluster import LocalCluster
from ppc_extproc_lab.localcluster.service_config import default_service_config

__all__ = ["SessionReport", "TurnOutcome", "run_sessions", "session_cluster_config", "session_scorer_config", "warm_up"]

_TIMEOUT = 30.0
SESSION_HEADER = "x-session-id"


def session_cluster_config(store_url: str | None, *, block_size: int = 16, weight: int = 20) -> dict[str, Any]:
    """The default service config with shared (``store_url``) or local session affinity; the
    default ``weight`` is above twice the default profile's other weights (9), so a bound
    session never loses its endpoint to its runner-up on score."""
    config = copy.deepcopy(default_service_config(block_size=block_size))
    session_id: dict[str, Any] = {"placement": "fewestBindings"}
    if store_url is not None:
        session_id["sharedStore"] = {"address": store_url, "timeoutMs": 100}
    plugins = config["plugins"]
    for plugin in plugins:
        if plugin.get("type") == "max-score-picker":
            plugin["parameters"] = {"maxNumOfEndpoints": 2}
    plugins.insert(len(plugins) - 1, {"type": "session-affinity-scorer",
                                      "parameters": {"strategy": "session_id", "sessionIdConfig": session_id}})  # fmt: skip
    profile = config["schedulingProfiles"][0]["plugins"]
    profile.insert(0, {"pluginRef": "session-affinity-scorer", "weight": weight})
    return config


def session_scorer_config(store_url: str, *, weight: int = 10, timeout_ms: int = 500) -> dict[str, Any]:
    """A config of a ``session-affinity-scorer`` alone (``fewestBindings``, bindings shared
    through the store at ``store_url``) and a ``max-score-picker``."""
    session_id = {"placement": "fewestBindings", "sharedStore": {"address": store_url, "timeoutMs": timeout_ms}}
    return {
        "apiVersion": "llm-d.ai/v1alpha1",
        "kind": "EndpointPickerConfig",
        "plugins": [
            {"type": "session-affinity-scorer", "parameters": {"strategy": "session_id", "sessionIdConfig": session_id}},
            {"type": "max-score-picker"},
        ],
        "schedulingProfiles": [{"name": "default", "plugins": [
            {"pluginRef": "session-affinity-scorer", "weight": weight}, {"pluginRef": "max-score-picker"}]}],
    }  # fmt: skip


@dataclass(frozen=True, slots=True)
class TurnOutcome:
    session: int
    turn: int
    status: int
    #: The engine that answered (``x-mock-vllm-endpoint``), None when none did.
    served: str | None
    seconds: float


@dataclass(slots=True)
class SessionReport:
    sessions: int
    turns: int
    outcomes: list[TurnOutcome] = field(default_factory=list)
    #: The engine killed, and the turn after which it was.
    victim: str | None = None
    kill_after_turn: int | None = None

    @property
    def errors(self) -> int:
        return sum(1 for o in self.outcomes if o.status != 200)

    def served_by(self, session: int) -> list[str | None]:
        """The engine of each turn of ``session``, in turn order."""
        return [o.served for o in sorted(self.outcomes, key=lambda o: o.turn) if o.session == session]

    def _split(self, session: int) -> tuple[list[str | None], list[str | None]]:
        cut = self.kill_after_turn if self.kill_after_turn is not None else self.turns
        served = self.served_by(session)
        return served[: cut + 1], served[cut + 1 :]

    def pinned_before(self) -> dict[int, str]:
        """Sessions served by one engine for every turn before the kill, with that engine."""
        out: dict[int, str] = {}
        for s in range(self.sessions):
            before, _ = self._split(s)
            if len(set(before)) == 1 and before[0] is not None:
                out[s] = before[0]
        return out

    def affinity_kept(self) -> int:
        """Sessions that stayed on one engine until it died, and then on one other engine."""
        kept = 0
        for s, engine in self.pinned_before().items():
            _, after = self._split(s)
            if not after:
                kept += 1
            elif engine != self.victim:
                kept += set(after) == {engine}
            else:
                kept += len(set(after)) == 1 and after[0] not in (None, engine)
        return kept

    def sessions_per_engine(self, *, final: bool) -> Counter[str]:
        """Sessions per engine at their first turn after the kill (``final``), or before it."""
        counts: Counter[str] = Counter()
        for s in range(self.sessions):
            before, after = self._split(s)
            turns = after if final and after else before
            if turns and turns[-1] is not None:
                counts[turns[-1]] += 1
        return counts

    @staticmethod
    def max_over_mean(counts: Counter[str]) -> float:
        return max(counts.values()) / statistics.fmean(counts.values()) if counts else 0.0

    def latency_ms(self, q: float) -> float:
        values = sorted(o.seconds for o in self.outcomes)
        return values[min(len(values) - 1, int(q * len(values)))] * 1000 if values else 0.0


def _complete(url: str, model: str, session: int, turn: int, prompt: list[int], tag: str = "") -> TurnOutcome:
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": 2}).encode()
    headers = {"content-type": "application/json", "x-request-id": f"session-{tag}{session}-turn-{turn}"}
    if session >= 0:
        headers[SESSION_HEADER] = f"session-{tag}{session}"
    request = urllib.request.Request(url + "/v1/completions", data=body, headers=headers)
    started = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=_TIMEOUT) as response:
            response.read()
            return TurnOutcome(session, turn, response.status, response.headers.get("x-mock-vllm-endpoint"),
                               time.monotonic() - started)  # fmt: skip
    except urllib.error.HTTPError as exc:
        exc.read()
        return TurnOutcome(session, turn, exc.code, exc.headers.get("x-mock-vllm-endpoint"), time.monotonic() - started)
    except OSError:
        return TurnOutcome(session, turn, 0, None, time.monotonic() - started)


def warm_up(cluster: LocalCluster, *, requests: int = 12, timeout: float = 30.0) -> None:
    """Send session-less requests until ``requests`` in a row are answered 200 (every replica
    and engine is serving through Envoy), within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    in_a_row = 0
    while in_a_row < requests:
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {requests} answers in a row through Envoy within {timeout:g}s")
        outcome = _complete(cluster.listener_url, cluster.model, -1, in_a_row, [1, 2, 3, 4])
        in_a_row = in_a_row + 1 if outcome.status == 200 else 0


def run_sessions(
    cluster: LocalCluster,
    *,
    sessions: int = 50,
    turns: int = 10,
    kill_after_turn: int | None = 4,
    clients: int = 8,
    turn_tokens: int = 48,
    seed: int = 0,
) -> SessionReport:
    """Send the rounds through ``cluster``'s Envoy; kill the busiest engine after ``kill_after_turn``.
    Session ids are ``session-<seed>-<i>``: runs with other seeds sharing a store do not meet."""
    warm_up(cluster)
    rng = random.Random(seed)
    prompts = [[rng.randrange(1, 150_000) for _ in range(turn_tokens)] for _ in range(sessions)]
    report = SessionReport(sessions, turns, kill_after_turn=kill_after_turn)
    with ThreadPoolExecutor(clients) as pool:
        for turn in range(turns):
            jobs = [pool.submit(_complete, cluster.listener_url, cluster.model, s, turn, list(prompts[s]), f"{seed}-")
                    for s in range(sessions)]  # fmt: skip
            round_outcomes = [job.result() for job in jobs]
            report.outcomes.extend(round_outcomes)
            for s in range(sessions):  # the next turn carries this one and a new user message
                prompts[s] += [rng.randrange(1, 150_000) for _ in range(turn_tokens)]
            if turn == kill_after_turn:
                busiest = Counter(o.served for o in round_outcomes if o.served is not None).most_common(1)
                if busiest:
                    report.victim = busiest[0][0]
                    cluster.kill_engine(cluster.engine_endpoints.index(report.victim))
    return report
