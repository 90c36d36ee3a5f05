"""What a run is made of: the workload's shape, its arrival stages and the engines' time model.

The shape follows llm-d's precise-prefix benchmark ("73% capacity": 150 tenants × a 6,000-token
shared context, 5 users per tenant asking 1,200-token questions, multi-turn), scaled down so a
cluster of mock engines fits on a 2-core machine.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["EngineProfile", "Stage", "WorkloadSpec", "from_flags", "staircase"]


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    """Tenants with a shared context; users asking questions in multi-turn sessions.

    A user's turn ``k`` of a session sends ``context(tenant) + Σ_{j<k} (question_j + answer_j) +
    question_k``; after ``turns_per_session`` turns the user starts a new session.
    """

    #: Tenants (customers), each with its own shared context (system prompt / document).
    tenants: int = 8
    #: Users per tenant; users are numbered ``tenant * users_per_tenant + i``.
    users_per_tenant: int = 4
    #: Tokens of each tenant's shared context (llm-d: 6,000).
    context_tokens: int = 2048
    #: Tokens of each question (llm-d: 1,200).
    question_tokens: int = 256
    #: ``max_tokens`` of every request (the answer appended to the next turn).
    output_tokens: int = 32
    #: Turns per session; turn 0 is context + question only.
    turns_per_session: int = 3
    #: Seed of every random choice (token ids, arrival times, users).
    seed: int = 0
    #: Token ids are drawn uniformly from ``[token_low, token_high)``.
    token_low: int = 1000
    token_high: int = 50_000
    #: The last ``long_tenants`` tenants have a ``long_context_tokens`` context instead (agentic
    #: sessions over a large repository or document: a length mix).
    long_tenants: int = 0
    long_context_tokens: int = 0

    def __post_init__(self) -> None:
        positive = (
            self.tenants, self.users_per_tenant, self.context_tokens, self.question_tokens,
            self.output_tokens, self.turns_per_session,
        )  # fmt: skip
        if min(positive) < 1:
            raise ValueError("tenants, users, token counts and turns must be >= 1")
        if not 0 <= self.token_low < self.token_high <= 1 << 32:
            raise ValueError("token range must satisfy 0 <= token_low < token_high <= 2^32")
        if not 0 <= self.long_tenants <= self.tenants or (self.long_tenants and self.long_context_tokens < 1):
            raise ValueError("long_tenants must be in [0, tenants], with long_context_tokens >= 1")

    @property
    def num_users(self) -> int:
        return self.tenants * self.users_per_tenant

    def tenant_of(self, user: int) -> int:
        return user // self.users_per_tenant

    def context_tokens_of(self, tenant: int) -> int:
        """Context length of ``tenant`` (the last ``long_tenants`` have the long one)."""
        return self.long_context_tokens if tenant >= self.tenants - self.long_tenants else self.context_tokens

    def prompt_tokens(self, turn: int, tenant: int = 0) -> int:
        """Prompt length of turn ``turn`` (0-based) of any session of ``tenant``."""
        return self.context_tokens_of(tenant) + turn * (self.question_tokens + self.output_tokens) + self.question_tokens

    @property
    def max_prompt_tokens(self) -> int:
        return self.prompt_tokens(self.turns_per_session - 1, self.tenants - 1 if self.long_tenants else 0)

    @property
    def working_set_tokens(self) -> int:
        """Tokens worth caching at once: every context plus every user's longest history."""
        history = self.prompt_tokens(self.turns_per_session - 1) + self.output_tokens - self.context_tokens
        contexts = sum(self.context_tokens_of(t) for t in range(self.tenants))
        return contexts + self.num_users * history


@dataclass(frozen=True, slots=True)
class Stage:
    """Poisson arrivals at ``rate_per_s`` for ``duration_s`` seconds."""

    rate_per_s: float
    duration_s: float

    def __post_init__(self) -> None:
        if self.rate_per_s <= 0 or self.duration_s <= 0:
            raise ValueError("stage rate and duration must be > 0")


def staircase(rates: Sequence[float], stage_seconds: float) -> list[Stage]:
    """A rising (or any) staircase: one stage of ``stage_seconds`` per rate."""
    return [Stage(float(r), stage_seconds) for r in rates]


@dataclass(frozen=True, slots=True)
class EngineProfile:
    """Mock engine flags: cache size and the time model (see ``mock_vllm/README.md``)."""

    block_size: int = 64
    num_blocks: int = 240
    max_num_seqs: int = 8
    prefill_tokens_per_s: float = 3_000.0
    decode_ms_per_token: float = 10.0
    extra_args: tuple[str, ...] = field(default=())

    @property
    def capacity_tokens(self) -> int:
        return self.block_size * self.num_blocks

    def engine_args(self) -> list[str]:
        """Time-model flags for ``LocalCluster(engine_args=...)`` (block size and blocks are
        passed separately so the service's block size follows)."""
        return [
            "--max-num-seqs", str(self.max_num_seqs),
            "--prefill-tokens-per-s", str(self.prefill_tokens_per_s),
            "--decode-ms-per-token", str(self.decode_ms_per_token),
            *self.extra_args,
        ]  # fmt: skip

    def check_fits(self, spec: WorkloadSpec) -> None:
        """``ValueError`` if the longest request could never be admitted by one engine."""
        need = -(-(spec.max_prompt_tokens + spec.output_tokens - 1) // self.block_size)
        if need > self.num_blocks:
            raise ValueError(
                f"longest request needs {need} blocks of {self.block_size} tokens; engines have {self.num_blocks}"
            )


def from_flags(args: argparse.Namespace) -> tuple[WorkloadSpec, EngineProfile]:
    """The workload and engine flags the demo and the routing benchmark share (``--tenants``,
    ``--users-per-tenant``, ``--context-tokens``, ``--question-tokens``, ``--output-tokens``,
    ``--turns``, ``--seed``; ``--block-size``, ``--num-blocks``, ``--max-num-seqs``,
    ``--prefill-tokens-per-s``, ``--decode-ms-per-token``)."""
    spec = WorkloadSpec(
        tenants=args.tenants, users_per_tenant=args.users_per_tenant, context_tokens=args.context_tokens,
        question_tokens=args.question_tokens, output_tokens=args.output_tokens, turns_per_session=args.turns,
        seed=args.seed,
    )  # fmt: skip
    profile = EngineProfile(
        block_size=args.block_size, num_blocks=args.num_blocks, max_num_seqs=args.max_num_seqs,
        prefill_tokens_per_s=args.prefill_tokens_per_s, decode_ms_per_token=args.decode_ms_per_token,
    )  # fmt: skip
    return spec, profile
