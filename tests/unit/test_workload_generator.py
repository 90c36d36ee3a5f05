"""The seeded workload: shapes, determinism, Poisson stages, multi-turn growth."""

from __future__ import annotations

import itertools
import statistics

import pytest

from ppc_extproc_lab.workload.generator import Arrival, Workload, arrivals
from ppc_extproc_lab.workload.spec import EngineProfile, Stage, WorkloadSpec, staircase

SPEC = WorkloadSpec(
    tenants=3,
    users_per_tenant=2,
    context_tokens=100,
    question_tokens=10,
    output_tokens=4,
    turns_per_session=3,
    seed=7,
)


def test_context_and_question_shapes_and_token_range() -> None:
    w = Workload(SPEC)
    for tenant in range(SPEC.tenants):
        ctx = w.context(tenant)
        assert len(ctx) == 100
        assert all(SPEC.token_low <= t < SPEC.token_high for t in ctx)
    assert len(w.question(0, 0, 0)) == 10
    # Different tenants and different questions do not share a first block.
    assert len({tuple(w.context(t)[:16]) for t in range(SPEC.tenants)}) == SPEC.tenants
    assert w.question(0, 0, 0) != w.question(0, 0, 1) != w.question(1, 0, 0)


def test_content_is_a_function_of_the_seed_only() -> None:
    a, b = Workload(SPEC), Workload(SPEC)
    # Asked in different orders, the same ids come back.
    b.question(5, 2, 1)
    assert a.context(2) == b.context(2)
    assert a.question(5, 2, 1) == b.question(5, 2, 1)
    other = Workload(WorkloadSpec(tenants=3, users_per_tenant=2, context_tokens=100, question_tokens=10, seed=8))
    assert other.context(0) != a.context(0)


def test_arrivals_are_deterministic_and_seed_dependent() -> None:
    stages = staircase([5, 10], 20)
    assert arrivals(SPEC, stages) == arrivals(SPEC, stages)
    assert arrivals(SPEC, stages) != arrivals(WorkloadSpec(seed=8), stages)


def test_arrivals_follow_the_staircase() -> None:
    spec = WorkloadSpec(seed=1)
    stages = [Stage(20.0, 50.0), Stage(60.0, 50.0)]
    sched = arrivals(spec, stages)
    times = [a.at_s for a in sched]
    assert times == sorted(times)
    assert [a.index for a in sched] == list(range(len(sched)))
    first = [a for a in sched if a.stage == 0]
    second = [a for a in sched if a.stage == 1]
    assert all(0 < a.at_s < 50 for a in first) and all(50 <= a.at_s < 100 for a in second)
    # Poisson counts: mean λT, sd √(λT); 5 sd bounds never flake.
    assert abs(len(first) - 1000) < 5 * 1000**0.5
    assert abs(len(second) - 3000) < 5 * 3000**0.5
    gaps = [b - a for a, b in itertools.pairwise(times) if b < 50]
    assert statistics.fmean(gaps) == pytest.approx(1 / 20, rel=0.15)


def test_max_requests_truncates() -> None:
    assert len(arrivals(SPEC, [Stage(100, 10)], max_requests=7)) == 7


def test_users_sessions_and_turns() -> None:
    sched = arrivals(SPEC, [Stage(50, 20)])
    assert {a.user for a in sched} == set(range(SPEC.num_users))
    for user in range(SPEC.num_users):
        mine = [a for a in sched if a.user == user]
        assert all(a.tenant == user // SPEC.users_per_tenant for a in mine)
        assert [(a.session, a.turn) for a in mine] == [(k // 3, k % 3) for k in range(len(mine))]


def _arrival(user: int, session: int, turn: int) -> Arrival:
    return Arrival(0, 0.0, 0, user, SPEC.tenant_of(user), session, turn)


def test_multi_turn_prompts_grow_by_question_and_answer() -> None:
    w = Workload(SPEC)
    conv = w.conversation(3)
    tenant = SPEC.tenant_of(3)
    p0 = conv.prompt(_arrival(3, 0, 0))
    assert p0 == w.context(tenant) + w.question(3, 0, 0)
    assert len(p0) == SPEC.prompt_tokens(0)
    answer0 = [33, 34, 35, 36]
    conv.answered(p0, answer0)
    p1 = conv.prompt(_arrival(3, 0, 1))
    assert p1 == p0 + answer0 + w.question(3, 0, 1)
    assert len(p1) == SPEC.prompt_tokens(1)
    conv.answered(p1, [40, 41, 42, 43])
    p2 = conv.prompt(_arrival(3, 0, 2))
    assert p2[: len(p1) + 4] == p1 + [40, 41, 42, 43]
    assert len(p2) == SPEC.prompt_tokens(2) == SPEC.max_prompt_tokens
    # A new session starts again from the tenant's context.
    conv.answered(p2, [1, 2, 3, 4])
    p3 = conv.prompt(_arrival(3, 1, 0))
    assert p3 == w.context(tenant) + w.question(3, 1, 0)


def test_conversation_rejects_other_users() -> None:
    with pytest.raises(ValueError):
        Workload(SPEC).conversation(0).prompt(_arrival(1, 0, 0))


def test_working_set_and_engine_fit() -> None:
    # contexts 3 × 100 + 6 users × (longest history 10+4+10+4+10 + answer 4 = 42)
    assert SPEC.working_set_tokens == 300 + 6 * 42
    EngineProfile(block_size=16, num_blocks=9).check_fits(SPEC)  # 138 prompt + 4 output − 1 = 141 tokens ⇒ 9 blocks
    with pytest.raises(ValueError, match="needs 9 blocks"):
        EngineProfile(block_size=16, num_blocks=8).check_fits(SPEC)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"tenants": 0},
        {"context_tokens": 0},
        {"turns_per_session": 0},
        {"token_low": 5, "token_high": 5},
    ],
)
def test_spec_validation(kwargs: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        WorkloadSpec(**kwargs)


def test_stage_validation_and_engine_args() -> None:
    with pytest.raises(ValueError):
        Stage(0, 10)
    args = EngineProfile(max_num_seqs=4, prefill_tokens_per_s=1000.0, decode_ms_per_token=5.0).engine_args()
    assert args == [
        "--max-num-seqs",
        "4",
        "--prefill-tokens-per-s",
        "1000.0",
        "--decode-ms-per-token",
        "5.0",
    ]
