"""The demo's defaults, shared by its CLI parser and ``run.DemoOptions`` (cheap to import)."""

from __future__ import annotations

__all__ = [
    "DEFAULT_DRAIN_S",
    "DEFAULT_DURATION_S",
    "DEFAULT_ENGINES",
    "DEFAULT_FORM",
    "DEFAULT_NUM_BLOCKS",
    "DEFAULT_POLICIES",
    "DEFAULT_RATE_PER_S",
    "FORMS",
    "PD_POLICIES",
]

DEFAULT_POLICIES: tuple[str, ...] = ("default", "round-robin")
#: ``demo --pd``: P/D on (prefill engines + decode pods) vs the same engines aggregated.
PD_POLICIES: tuple[str, ...] = ("pd", "default")
#: How the requests are sent: chat completions through the ``openai`` client (what users send),
#: completions with string prompts, or token-id prompts.
FORMS = ("chat", "text", "tokens")
DEFAULT_FORM = "chat"
DEFAULT_ENGINES = 4
DEFAULT_RATE_PER_S = 10.0
DEFAULT_DURATION_S = 40.0
DEFAULT_DRAIN_S = 30.0
#: 160 blocks × 64 tokens = 10,240 tokens per engine: fewer than the 8 tenants' contexts (16,384).
DEFAULT_NUM_BLOCKS = 160
