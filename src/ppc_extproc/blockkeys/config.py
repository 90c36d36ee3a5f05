"""``tokenProcessorConfig``: block size, hash seed and algorithm of the request keys."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["HASH_ALGORITHMS", "TokenProcessorConfig"]

#: Accepted ``hashAlgorithm`` spellings ("" means llm-d's default, cbor-fnv; "xxhash" is a later alias).
HASH_ALGORITHMS = ("xxh64", "xxhash", "cbor-fnv", "")


@dataclass(frozen=True, slots=True)
class TokenProcessorConfig:
    """How request keys are computed. Must match on the event side and the request side of an index."""

    #: Canonical block size in tokens (llm-d default 16; llm-d guides and vLLM deployments use 64).
    block_size_tokens: int = 16
    #: Raw UTF-8 bytes feed the init hash (not PYTHONHASHSEED semantics).
    hash_seed: str = ""
    #: ``xxh64`` (our default: llm-d's fast option) or ``cbor-fnv`` (llm-d's default).
    hash_algorithm: str = "xxh64"

    def __post_init__(self) -> None:
        if self.block_size_tokens <= 0:
            raise ValueError(f"blockSizeTokens must be greater than 0, got {self.block_size_tokens}")
        if self.hash_algorithm not in HASH_ALGORITHMS:
            raise ValueError(
                f"hashAlgorithm must be one of xxh64, cbor-fnv; got {self.hash_algorithm!r}"
            )
