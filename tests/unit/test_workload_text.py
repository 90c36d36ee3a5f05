"""The text workload: seeded ASCII content, the three forms of one prompt, multi-turn growth."""

from __future__ import annotations

import pytest

from ppc_extproc_lab.workload.generator import Arrival
from ppc_extproc_lab.workload.spec import WorkloadSpec
from ppc_extproc_lab.workload.text import TextPrompt, TextWorkload, words

SPEC = WorkloadSpec(tenants=3, users_per_tenant=2, context_tokens=200, question_tokens=20, output_tokens=4,
                    turns_per_session=3, seed=5)  # fmt: skip


def arrival(user: int, session: int, turn: int) -> Arrival:
    return Arrival(index=0, at_s=0.0, stage=0, user=user, tenant=SPEC.tenant_of(user), session=session, turn=turn)


def test_words_are_ascii_of_the_exact_length_and_seeded() -> None:
    text = words("s", 123)
    assert len(text) == 123 and text.isascii() and " " in text
    assert words("s", 123) == text != words("t", 123)
    assert words("s", 1) == text[:1]


def test_contexts_and_questions_have_the_spec_lengths_and_differ() -> None:
    w = TextWorkload(SPEC)
    assert [len(w.context(t)) for t in range(3)] == [200] * 3
    assert len({w.context(t)[:32] for t in range(3)}) == 3
    assert len(w.question(0, 0, 0)) == 20 and w.question(0, 0, 0) != w.question(0, 0, 1)
    assert len(TextWorkload(SPEC, chars_per_token=4).context(0)) == 800
    with pytest.raises(ValueError):
        TextWorkload(SPEC, chars_per_token=0)


def test_one_prompt_in_every_form() -> None:
    p = TextPrompt(1, "ctx ", (("q1 ", "a1 "),), "q2")
    assert p.text == "ctx q1 a1 q2"
    assert p.token_ids() == list(b"ctx q1 a1 q2")
    assert p.messages() == [
        {"role": "system", "content": "ctx "},
        {"role": "user", "content": "q1 "},
        {"role": "assistant", "content": "a1 "},
        {"role": "user", "content": "q2"},
    ]
    ctx = TextWorkload(SPEC).context_prompt(2)
    assert ctx.text == TextWorkload(SPEC).context(2) and ctx.history == ()


def test_turns_extend_the_previous_prompt_and_a_new_session_starts_over() -> None:
    w = TextWorkload(SPEC)
    conv = w.conversation(3)
    first = conv.prompt(arrival(3, 0, 0))
    assert first.text == w.context(1) + w.question(3, 0, 0)
    conv.answered(first, "ANSWER")
    second = conv.prompt(arrival(3, 0, 1))
    assert second.text.startswith(first.text + "ANSWER")
    assert second.history == ((w.question(3, 0, 0), "ANSWER"),)
    fresh = conv.prompt(arrival(3, 1, 0))
    assert fresh.history == () and fresh.text == w.context(1) + w.question(3, 1, 0)
    with pytest.raises(ValueError):
        conv.prompt(arrival(2, 0, 0))
