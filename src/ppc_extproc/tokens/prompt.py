"""``TokenizedPrompt``: the token ids a request carries, in the form block keys are computed from."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MultimodalFeature", "TokenizedPrompt"]


@dataclass(frozen=True, slots=True)
class MultimodalFeature:
    """One multimodal item of a prompt: its identifier and the token span its placeholder covers."""

    hash: str
    offset: int
    length: int


@dataclass(frozen=True, slots=True)
class TokenizedPrompt:
    """One or more prompts of uint32 token ids, plus what else feeds the block hashes.

    Token ids are little-endian uint32 bytes: the request path extracts them from JSON without
    creating a Python int per token, and the xxh64 chain hashes those bytes directly.
    """

    #: Model name the keys are rooted in (after any rewrite; a LoRA adapter name for LoRA).
    model: str
    #: Token ids of each prompt, little-endian uint32.
    prompts: tuple[bytes, ...]
    #: Multimodal items of the (single) prompt, sorted by offset.
    features: tuple[MultimodalFeature, ...] = ()
    #: vLLM's ``cache_salt``; folded into block 0's extras when non-empty.
    cache_salt: str | None = None
    #: False for estimated ids (llm-d's byte-packing backend): locality keys only, which can never
    #: match the engine's blocks, so the precise producer ignores them.
    exact: bool = True

    def num_tokens(self) -> int:
        return sum(len(p) for p in self.prompts) // 4
