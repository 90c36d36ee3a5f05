"""The seeded workload: token ids, the arrival schedule, and the users' conversations.

Everything is a pure function of the :class:`~ppc_extproc_lab.workload.spec.WorkloadSpec` seed:
contexts and questions are drawn from RNGs keyed by what they are (tenant, or user/session/turn),
so they do not depend on the order they are asked for; arrivals come from one RNG. The only
input from outside is each answer, which the mock engines derive from the prompt alone — so
every policy sees the same request sequence.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from ppc_extproc_lab.workload.spec import Stage, WorkloadSpec

__all__ = ["Arrival", "Conversation", "Workload", "arrivals"]


@dataclass(frozen=True, slots=True)
class Arrival:
    """One request of the schedule: when (seconds from the start), whose, which turn."""

    index: int
    at_s: float
    stage: int
    user: int
    tenant: int
    session: int
    turn: int


def _tokens(spec: WorkloadSpec, key: str, n: int) -> list[int]:
    rng = random.Random(f"{spec.seed}/{key}")
    lo, span = spec.token_low, spec.token_high - spec.token_low
    return [lo + int(rng.random() * span) for _ in range(n)]


def arrivals(spec: WorkloadSpec, stages: Sequence[Stage], max_requests: int | None = None) -> list[Arrival]:
    """Poisson arrivals through ``stages`` (rate changes at stage boundaries), users uniform.

    A user's ``k``-th arrival is turn ``k mod turns_per_session`` of session ``k div turns``.
    """
    rng = random.Random(f"{spec.seed}/arrivals")
    out: list[Arrival] = []
    counts = [0] * spec.num_users
    start = 0.0
    for s, stage in enumerate(stages):
        end = start + stage.duration_s
        t = start
        while True:
            # Exponential gaps are memoryless: restarting at the boundary keeps each stage Poisson.
            t += rng.expovariate(stage.rate_per_s)
            if t >= end or (max_requests is not None and len(out) >= max_requests):
                break
            user = rng.randrange(spec.num_users)
            k = counts[user]
            counts[user] += 1
            out.append(
                Arrival(
                    index=len(out),
                    at_s=t,
                    stage=s,
                    user=user,
                    tenant=spec.tenant_of(user),
                    session=k // spec.turns_per_session,
                    turn=k % spec.turns_per_session,
                )
            )
        start = end
    return out


class Workload:
    """Token content of a spec: contexts (cached per tenant) and questions."""

    def __init__(self, spec: WorkloadSpec) -> None:
        self.spec = spec
        self._contexts: dict[int, list[int]] = {}

    def context(self, tenant: int) -> list[int]:
        """The tenant's shared context (system prompt / document)."""
        ctx = self._contexts.get(tenant)
        if ctx is None:
            n = self.spec.context_tokens_of(tenant)
            ctx = self._contexts[tenant] = _tokens(self.spec, f"context/{tenant}", n)
        return ctx

    def context_prompt(self, tenant: int) -> list[int]:
        """The tenant's context as a prompt of its own."""
        return self.context(tenant)

    def question(self, user: int, session: int, turn: int) -> list[int]:
        return _tokens(self.spec, f"question/{user}/{session}/{turn}", self.spec.question_tokens)

    def conversation(self, user: int) -> Conversation:
        return Conversation(self, user)


class Conversation:
    """One user's running session: builds each turn's prompt and remembers the answers."""

    def __init__(self, workload: Workload, user: int) -> None:
        self.workload = workload
        self.user = user
        self.tenant = workload.spec.tenant_of(user)
        self._session = -1
        self._history: list[int] = []

    def prompt(self, arrival: Arrival) -> list[int]:
        """The prompt of ``arrival`` (this user's next turn): context + history + question."""
        if arrival.user != self.user:
            raise ValueError("arrival belongs to another user")
        if arrival.session != self._session or arrival.turn == 0:
            self._session = arrival.session
            self._history = []
        question = self.workload.question(self.user, arrival.session, arrival.turn)
        return [*self.workload.context(self.tenant), *self._history, *question]

    def answered(self, prompt: Sequence[int], answer: Sequence[int]) -> None:
        """Record the answer to ``prompt``: the next turn continues from prompt + answer."""
        context = len(self.workload.context(self.tenant))
        self._history = [*prompt[context:], *answer]
