"""What a tokenizer backend returns: token ids, or the reason there are none."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from ppc_extproc.tokens.prompt import MultimodalFeature

__all__ = [
    "BAD_RESPONSE",
    "BREAKER_OPEN",
    "EMPTY",
    "MULTIMODAL_NEEDS_RENDER",
    "NO_TOKENIZER",
    "TEMPLATE_ERROR",
    "TIMEOUT",
    "TRANSPORT",
    "UNSUPPORTED_BODY",
    "UNTRUSTED_CHAT_TEMPLATE",
    "TokenizeResult",
    "http_reason",
]

#: A content part needs the model's processor; only a render backend can tokenize it.
MULTIMODAL_NEEDS_RENDER: Final = "multimodal_needs_render"
#: The body's API is not tokenized by this backend (e.g. Responses locally).
UNSUPPORTED_BODY: Final = "unsupported_body"
#: The render service's circuit breaker is open: no call was made.
BREAKER_OPEN: Final = "breaker_open"
#: The render call exceeded its timeout.
TIMEOUT: Final = "timeout"
#: Connection refused/reset or another transport error.
TRANSPORT: Final = "transport"
#: A 2xx answer that is not a render result.
BAD_RESPONSE: Final = "bad_response"
#: No tokenizer for the request's model: no configured path, nothing in the caches, and no
#: engine answered its render endpoint.
NO_TOKENIZER: Final = "no_tokenizer"
#: The chat template failed on this request (``raise_exception``, a bad kwarg): routed by load.
TEMPLATE_ERROR: Final = "template_error"
#: A request ``chat_template`` without ``trustRequestChatTemplate`` (vLLM refuses it unless trusted).
UNTRUSTED_CHAT_TEMPLATE: Final = "untrusted_chat_template"
#: Tokenization produced no tokens.
EMPTY: Final = "empty"


def http_reason(status: int) -> str:
    """``http_<code>`` for a non-2xx render answer."""
    return f"http_{status}"


@dataclass(frozen=True, slots=True)
class TokenizeResult:
    """Token ids of each prompt (little-endian uint32), or ``reason`` why there are none."""

    prompts: tuple[bytes, ...] = ()
    #: Multimodal items of the (single) prompt, sorted by offset (render backend only).
    features: tuple[MultimodalFeature, ...] = ()
    cache_salt: str | None = None
    #: None on success; else one of the constants of this module or ``http_<code>``.
    reason: str | None = None
    #: Human-readable detail for logs (an error body snippet, the exception).
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.reason is None

    def num_tokens(self) -> int:
        return sum(len(p) for p in self.prompts) // 4

    @classmethod
    def failed(cls, reason: str, detail: str = "", cache_salt: str | None = None) -> TokenizeResult:
        return cls(reason=reason, detail=detail, cache_salt=cache_salt)
