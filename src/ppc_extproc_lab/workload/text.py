"""The shared-prefix workload as text: what users send, for every request form.

Same shape and seeding as :mod:`~ppc_extproc_lab.workload.generator` (tenants' shared contexts,
users' multi-turn sessions), but the content is ASCII words, so one prompt can be sent as a
string (``/v1/completions``), as chat messages (``/v1/chat/completions``: the context is the
system message, earlier turns are user/assistant pairs) or as the token ids the engine derives
from the string. Lengths are in characters, which are tokens for the mock engine's byte
tokeniser (a string prompt is its UTF-8 bytes); a real tokeniser makes about four characters one
token, so scale the spec's lengths with ``chars_per_token``.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ppc_extproc_lab.workload.generator import Arrival
from ppc_extproc_lab.workload.spec import WorkloadSpec

__all__ = ["TextConversation", "TextPrompt", "TextWorkload", "chars_per_token", "words"]

_VOCABULARY = (
    "the of and to in is that for it as with was on be by at this from or an are have not but "
    "which all were can one there their more if will would about so out up what when time into "
    "cache block prefix token router engine request model query index event stream batch shard "
    "tenant context session answer review patch commit branch build test deploy config schema"
)
_WORDS = tuple(_VOCABULARY.split())


def words(seed: str, n: int) -> str:
    """``n`` characters of space-separated lowercase words, a pure function of ``seed``."""
    rng = random.Random(seed)
    parts: list[str] = []
    size = 0
    while size < n:
        w = rng.choice(_WORDS)
        parts.append(w)
        size += len(w) + 1
    return " ".join(parts)[:n].ljust(n)


def chars_per_token(encode: Callable[[str], list[int]], sample_chars: int = 20_000) -> float:
    """Characters of this workload's text per token of ``encode`` (1.0 for UTF-8 bytes)."""
    sample = words("chars-per-token", sample_chars)
    return sample_chars / max(1, len(encode(sample)))


@dataclass(frozen=True, slots=True)
class TextPrompt:
    """One turn: the tenant's context, the session's earlier (question, answer) pairs, the question."""

    tenant: int
    context: str
    history: tuple[tuple[str, str], ...]
    question: str

    @property
    def text(self) -> str:
        """The completions prompt: everything concatenated (each turn extends the last one)."""
        return self.context + "".join(q + a for q, a in self.history) + self.question

    def token_ids(self) -> list[int]:
        """What the mock engine tokenises :attr:`text` into (its UTF-8 bytes)."""
        return list(self.text.encode("utf-8"))

    def messages(self) -> list[dict[str, Any]]:
        """The chat form: system = context, then user/assistant turns, then the question."""
        out: list[dict[str, Any]] = [{"role": "system", "content": self.context}]
        for q, a in self.history:
            out += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
        out.append({"role": "user", "content": self.question})
        return out


class TextWorkload:
    """Text content of a spec: contexts (cached per tenant) and questions."""

    def __init__(self, spec: WorkloadSpec, *, chars_per_token: float = 1.0) -> None:
        if chars_per_token <= 0:
            raise ValueError("chars_per_token must be > 0")
        self.spec = spec
        self.chars_per_token = chars_per_token
        self._contexts: dict[int, str] = {}

    def _chars(self, tokens: int) -> int:
        return max(1, round(tokens * self.chars_per_token))

    def context(self, tenant: int) -> str:
        ctx = self._contexts.get(tenant)
        if ctx is None:
            n = self._chars(self.spec.context_tokens_of(tenant))
            ctx = self._contexts[tenant] = words(f"{self.spec.seed}/context/{tenant}", n)
        return ctx

    def context_prompt(self, tenant: int) -> TextPrompt:
        """The tenant's context as a prompt of its own (empty question)."""
        return TextPrompt(tenant, self.context(tenant), (), "")

    def question(self, user: int, session: int, turn: int) -> str:
        return words(f"{self.spec.seed}/question/{user}/{session}/{turn}", self._chars(self.spec.question_tokens))

    def conversation(self, user: int) -> TextConversation:
        return TextConversation(self, user)


class TextConversation:
    """One user's running session as text: builds each turn and remembers the answers."""

    def __init__(self, workload: TextWorkload, user: int) -> None:
        self.workload = workload
        self.user = user
        self.tenant = workload.spec.tenant_of(user)
        self._session = -1
        self._history: tuple[tuple[str, str], ...] = ()

    def prompt(self, arrival: Arrival) -> TextPrompt:
        if arrival.user != self.user:
            raise ValueError("arrival belongs to another user")
        if arrival.session != self._session or arrival.turn == 0:
            self._session = arrival.session
            self._history = ()
        question = self.workload.question(self.user, arrival.session, arrival.turn)
        return TextPrompt(self.tenant, self.workload.context(self.tenant), self._history, question)

    def answered(self, prompt: TextPrompt, answer: str) -> None:
        """The next turn continues from ``prompt`` and its ``answer``."""
        self._history = (*prompt.history, (prompt.question, answer))
