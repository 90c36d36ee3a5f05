"""Typed data keys: what producers write and consumers read, as llm-d names them.

A key is a data type and the producer that writes it, shown ``"<DataType>/<producer>"``
(llm-d-router ``pkg/epp/framework/interface/plugin/datakey.go``). Both are typed by the value
they carry: ``SchedulingContext.get(key)`` and ``endpoint_value(endpoint, key)`` return that type.
Producers declare the keys they write, consumers what they need; the loader checks at startup
that every required key has a producer (creating llm-d's default producer where one exists) and
orders producers so that each runs after the producers it consumes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

from ppc_extproc.ids import EndpointId
from ppc_extproc.matchinfo import PREFIX_MATCH_INFO_KEY, PrefixCacheMatchInfo

if TYPE_CHECKING:
    from ppc_extproc.framework.endpoint import Endpoint
    from ppc_extproc.tokens import TokenizedPrompt

__all__ = [
    "DISAGG_PEER",
    "ENGINE_METRICS",
    "IN_FLIGHT_LOAD",
    "PEER_ENDPOINT",
    "PREFIX_CACHE_MATCH_INFO",
    "TOKENIZED_PROMPT",
    "Consumes",
    "DataKey",
    "DataType",
    "InFlightLoad",
]

#: Covariant: keys are immutable, so a ``DataKey[PrefixCacheMatchInfo]`` is a ``DataKey[object]``.
T = TypeVar("T", covariant=True)


@dataclass(frozen=True, slots=True)
class DataType(Generic[T]):
    """A kind of data (llm-d's ``DataType``), typed by its value."""

    name: str

    def of(self, producer: str) -> DataKey[T]:
        """This type as written by ``producer``."""
        return DataKey(self, producer)

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True, slots=True)
class DataKey(Generic[T]):
    """One producer's output of one data type."""

    data_type: DataType[T]
    producer: str
    #: ``"<DataType>/<producer>"``: the display and config form, and the context's dict key (a
    #: str caches its hash; the request path looks keys up per endpoint).
    text: str = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "text", f"{self.data_type.name}/{self.producer}")

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True, slots=True)
class Consumes(Generic[T]):
    """A consumer's need: a data type from a named producer, or (``producer`` None) from any."""

    data_type: DataType[T]
    producer: str | None = None
    #: Optional needs without a producer are only logged.
    required: bool = True
    #: For ``TokenizedPrompt``: estimated (byte-packed) token ids are useless to this consumer.
    exact_tokens: bool = False

    def satisfied_by(self, key: DataKey[object]) -> bool:
        return key.data_type == self.data_type and (self.producer is None or key.producer == self.producer)

    def __str__(self) -> str:
        return f"{self.data_type.name}/{self.producer or '*'}"


class InFlightLoad(Protocol):
    """Live in-flight counts per endpoint of the requests this replica routed and has not seen
    finish (``scheduling.inflight.InflightTracker`` is one)."""

    def requests(self, endpoint: EndpointId) -> int: ...

    def tokens(self, endpoint: EndpointId) -> int: ...


#: The request's token ids. They travel on the request (``LLMRequest.tokenized``): a body of
#: token ids carries them with no producer at all.
TOKENIZED_PROMPT: DataType[TokenizedPrompt] = DataType("TokenizedPrompt")
#: Per-endpoint match info (``SchedulingContext.endpoint_value``).
PREFIX_CACHE_MATCH_INFO: DataType[PrefixCacheMatchInfo] = DataType(PREFIX_MATCH_INFO_KEY)
#: Per-endpoint engine load metrics. Not per request: metrics extractors write the engine-metrics
#: store (``Services.engine_metrics``) that its consumers read; declaring it gets a metrics source.
ENGINE_METRICS: DataType[object] = DataType("EngineMetrics")
#: Per-request: a live view of the in-flight load (llm-d's ``InFlightLoadDataKey``,
#: ``pkg/epp/framework/plugins/datalayer/attribute/concurrency``).
IN_FLIGHT_LOAD: DataType[InFlightLoad] = DataType("InFlightLoadDataKey")
#: Per-request: the endpoint an earlier stage of a P/D handler picked (the decode pick when
#: decode runs first), for a later profile to compare against (llm-d's ``peer-endpoint``,
#: ``pkg/epp/framework/plugins/scheduling/profilehandler/disagg/disagg_profile_handler.go``).
PEER_ENDPOINT: DataType[Endpoint] = DataType("peer-endpoint")
#: Where the disaggregation handlers put it (llm-d: the key's producer is the handler's type).
DISAGG_PEER: DataKey[Endpoint] = PEER_ENDPOINT.of("disagg-profile-handler")
