"""The mock engine's parameters and lifetime counters (re-exported by
:mod:`~ppc_extproc_lab.mock_vllm.engine`)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["EngineConfig", "EngineCounters"]


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Engine parameters (CLI flags of ``ppc-extproc mock-vllm``)."""

    model: str = "mock-model"
    block_size: int = 16
    num_blocks: int = 2048
    max_num_seqs: int = 16
    prefill_tokens_per_s: float = 20_000.0
    decode_ms_per_token: float = 5.0
    seed: int = 0
    #: "full": one full-attention KV-cache group; "hybrid": plus a sliding-window group and a
    #: Mamba group publishing at the same (inflated) block size, as vLLM's hybrid models do.
    kv_groups: str = "full"
    #: Transfer time of one prompt token a decode leg receives from a remote prefill.
    kv_transfer_ms_per_token: float = 0.01

    def __post_init__(self) -> None:
        if self.kv_groups not in ("full", "hybrid"):
            raise ValueError("kv_groups must be 'full' or 'hybrid'")
        if self.block_size <= 0 or self.num_blocks <= 0 or self.max_num_seqs <= 0:
            raise ValueError("block_size, num_blocks and max_num_seqs must be positive")
        if self.prefill_tokens_per_s <= 0 or self.decode_ms_per_token < 0:
            raise ValueError("prefill_tokens_per_s must be > 0 and decode_ms_per_token >= 0")
        if self.kv_transfer_ms_per_token < 0:
            raise ValueError("kv_transfer_ms_per_token must be >= 0")


@dataclass(slots=True)
class EngineCounters:
    """Lifetime counters (exported as Prometheus counters)."""

    requests_total: int = 0
    requests_finished: int = 0
    requests_aborted: int = 0
    requests_rejected: int = 0
    prompt_tokens_total: int = 0
    generation_tokens_total: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    restarts: int = 0
    #: Prefill legs (``do_remote_decode``) and decode legs (``do_remote_prefill``) received.
    remote_decode_requests: int = 0
    remote_prefill_requests: int = 0
    #: Decode legs that received KV, and the prompt tokens they received.
    kv_transfers: int = 0
    kv_transfer_tokens: int = 0
    #: Decode legs whose ``kv_transfer_params`` vLLM would not pull with (prefilled locally).
    kv_transfer_invalid: int = 0
