"""Plugin roles, as narrow Protocols (llm-d's framework interfaces).

    Producer   produce(ctx) writes attributes per endpoint; pre_request(ctx, targets) after the pick;
               extract(event) reacts to endpoint add/update/delete
    Filter     filter(ctx, endpoints) -> endpoints
    Scorer     score(ctx, endpoints) -> {endpoint id: score in [0, 1]}
    Picker     pick(ctx, scored) -> endpoints in preference order
    Hooks      pre_request / response_complete, for plugins that keep per-endpoint state
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from ppc_extproc.ids import EndpointId
from ppc_extproc.scheduling.types import Endpoint, EndpointEvent, SchedulingContext

__all__ = [
    "EndpointExtractor",
    "Filter",
    "Lifecycle",
    "Picker",
    "Plugin",
    "PreRequestHook",
    "Producer",
    "ResponseCompleteHook",
    "ResponseInfo",
    "Scorer",
]


class Plugin(Protocol):
    #: Instance name (``name`` in the config, defaulting to the type).
    name: str
    #: Registered type name, e.g. ``prefix-cache-scorer``.
    type_name: str


@runtime_checkable
class Producer(Protocol):
    name: str
    type_name: str

    def produce(self, ctx: SchedulingContext) -> None: ...


@runtime_checkable
class Filter(Protocol):
    name: str
    type_name: str

    def filter(self, ctx: SchedulingContext, endpoints: Sequence[Endpoint]) -> list[Endpoint]: ...


@runtime_checkable
class Scorer(Protocol):
    name: str
    type_name: str

    def score(self, ctx: SchedulingContext, endpoints: Sequence[Endpoint]) -> dict[EndpointId, float]: ...


@runtime_checkable
class Picker(Protocol):
    name: str
    type_name: str

    def pick(self, ctx: SchedulingContext, scored: Sequence[tuple[Endpoint, float]]) -> list[Endpoint]: ...


@runtime_checkable
class PreRequestHook(Protocol):
    def pre_request(self, ctx: SchedulingContext, targets: Sequence[Endpoint]) -> None: ...


@dataclass(frozen=True, slots=True)
class ResponseInfo:
    """What the response path learned about a routed request."""

    request_id: str
    #: Endpoint that served (the served-endpoint metadata), or the first target.
    endpoint: EndpointId
    status: int = 200
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int | None = None


@runtime_checkable
class ResponseCompleteHook(Protocol):
    def response_complete(self, ctx: SchedulingContext, info: ResponseInfo) -> None: ...


@runtime_checkable
class EndpointExtractor(Protocol):
    def extract(self, event: EndpointEvent) -> None: ...


@runtime_checkable
class Lifecycle(Protocol):
    """Plugins that own threads or sockets are started with the service and stopped with it."""

    def start(self) -> None: ...

    def stop(self, timeout: float = 5.0) -> None: ...

