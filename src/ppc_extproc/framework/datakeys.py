"""Data keys: what producers write and consumers read, as llm-d names them.

A key is ``"<DataType>/<producer name>"`` (llm-d-router
``pkg/epp/framework/interface/plugin/datakey.go``). Producers declare the keys they write,
consumers the keys they need; the loader checks at startup that every required key has a
producer (creating llm-d's default producer where one exists) and orders producers so that each
runs after the producers it consumes.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "ENGINE_METRICS",
    "PREFIX_CACHE_MATCH_INFO",
    "TOKENIZED_PROMPT",
    "Consumes",
    "DataKey",
]

#: The request's token ids (``LLMRequest.tokenized``).
TOKENIZED_PROMPT = "TokenizedPrompt"
#: Per-endpoint ``PrefixCacheMatchInfo`` (``SchedulingContext`` attributes).
PREFIX_CACHE_MATCH_INFO = "PrefixCacheMatchInfoDataKey"
#: Per-endpoint engine load metrics (``Services.engine_metrics``), written by metrics extractors.
ENGINE_METRICS = "EngineMetrics"


@dataclass(frozen=True, slots=True)
class DataKey:
    """One producer's output of one data type."""

    data_type: str
    producer: str

    def __str__(self) -> str:
        return f"{self.data_type}/{self.producer}"


@dataclass(frozen=True, slots=True)
class Consumes:
    """A consumer's need: a data type from a named producer, or (``producer`` None) from any."""

    data_type: str
    producer: str | None = None
    #: Optional needs without a producer are only logged.
    required: bool = True
    #: For ``TokenizedPrompt``: estimated (byte-packed) token ids are useless to this consumer.
    exact_tokens: bool = False

    def satisfied_by(self, key: DataKey) -> bool:
        return key.data_type == self.data_type and (self.producer is None or key.producer == self.producer)

    def __str__(self) -> str:
        return f"{self.data_type}/{self.producer or '*'}"
