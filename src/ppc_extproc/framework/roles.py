"""Plugin roles, as typed protocols (llm-d's framework interfaces).

Every plugin class names the roles it plays by subclassing them; the loader classifies each
plugin once (``framework.classify``) and wires it by role. Roles:

    DataProducer / AsyncDataProducer   write request data before scheduling (token ids, match info)
    Filter, Scorer, Picker             one scheduling profile: filters in order, weighted scorers, a picker
    ProfileHandler                     which profiles run, and what their results mean
    EndpointSource, PollingSource      data sources: endpoint notifications, periodic polls
    EndpointExtractor, MetricsExtractor  what those sources feed
    RequestParser                      claims request paths (``requestHandler.parsers``)
    PreRequest, ResponseComplete       hooks after the pick and when the response ends
    ResponseHeaderProcessor            headers added to the response sent to the client
    Lifecycle, Ticker, StateReporter   start/stop with the service, periodic housekeeping, state view
    CrossReplicaSyncer                 shares state with the other replicas (``dataLayer.crossReplicaSyncerPluginRef``)
    StreamingKeyProducer               computes block keys while a large body streams in
    Discovery                          keeps the endpoint set current (the edge of the data layer)

Consumers (producers, scorers, filters) declare the data they read with ``consumes()``; producers
declare what they write with ``produces()``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Protocol

from ppc_extproc.framework.context import (
    ProfileResult,
    ResponseInfo,
    SchedulingContext,
    SchedulingResult,
)
from ppc_extproc.framework.datakeys import Consumes, DataKey
from ppc_extproc.framework.endpoint import Endpoint, EndpointEvent
from ppc_extproc.ids import EndpointId

if TYPE_CHECKING:
    from ppc_extproc.blockkeys import TokenProcessor
    from ppc_extproc.events.stats import IngestStats
    from ppc_extproc.index.memory import IndexStats

__all__ = [
    "AsyncDataProducer",
    "CrossReplicaStats",
    "CrossReplicaSyncer",
    "DataConsumer",
    "DataProducer",
    "Discovery",
    "EndpointExtractor",
    "EndpointRegistry",
    "EndpointSource",
    "Filter",
    "Lifecycle",
    "MetricsExtractor",
    "Picker",
    "Plugin",
    "PluginReferences",
    "PluginState",
    "PollingSource",
    "PreRequest",
    "ProfileHandler",
    "RequestParser",
    "ResponseComplete",
    "ResponseHeaderProcessor",
    "Scorer",
    "StateReporter",
    "StreamingKeyProducer",
    "Ticker",
]


class Plugin(Protocol):
    #: Instance name (``name`` in the config, defaulting to the type).
    name: str
    #: Registered type name, e.g. ``prefix-cache-scorer`` (set by ``plugins.registry.register``).
    type_name: str = ""


class DataConsumer(Plugin, Protocol):
    def consumes(self) -> tuple[Consumes[object], ...]:
        """The data this plugin reads; the loader checks each required one has a producer."""
        ...


class DataProducer(DataConsumer, Protocol):
    def produces(self) -> frozenset[DataKey[object]]: ...

    def produce(self, ctx: SchedulingContext) -> None:
        """Write this producer's data for the request (never raises for a request's content:
        the router logs and continues without it)."""
        ...


class AsyncDataProducer(DataConsumer, Protocol):
    """A producer that may wait on I/O (a render service); the router awaits it."""

    #: Bound on one call (llm-d's ``ProduceTimeout()``); None: the producer bounds itself.
    produce_timeout_seconds: float | None

    def produces(self) -> frozenset[DataKey[object]]: ...

    async def produce_async(self, ctx: SchedulingContext) -> None: ...


class Filter(Plugin, Protocol):
    def filter(self, ctx: SchedulingContext, endpoints: Sequence[Endpoint]) -> list[Endpoint]: ...


class Scorer(Plugin, Protocol):
    def score(self, ctx: SchedulingContext, endpoints: Sequence[Endpoint]) -> dict[EndpointId, float]:
        """Scores in [0, 1] (higher is better); an endpoint left out counts 0."""
        ...


class Picker(Plugin, Protocol):
    def pick(self, ctx: SchedulingContext, scored: Sequence[tuple[Endpoint, float]]) -> list[Endpoint]:
        """Endpoints in preference order (the first is the destination)."""
        ...


class ProfileHandler(Plugin, Protocol):
    #: Whether the handler runs several profiles per request (P/D); the loader refuses a
    #: configuration of several profiles under a handler that runs one.
    multi_profile: ClassVar[bool] = False

    def pick_profiles(
        self, ctx: SchedulingContext, profiles: Sequence[str], results: Mapping[str, ProfileResult]
    ) -> list[str]:
        """Profiles to run next, given the results so far; empty ends the cycle."""
        ...

    def process_results(self, ctx: SchedulingContext, results: Mapping[str, ProfileResult]) -> SchedulingResult: ...


class PluginReferences(Plugin, Protocol):
    """A plugin that names other plugins in its parameters (a profile handler's deciders): the
    loader calls ``resolve_references`` once every plugin exists, whatever the document order."""

    def resolve_references(self, plugins: Mapping[str, Plugin]) -> None:
        """Look the named plugins up; ``ConfigError`` at the parameter's path when one is missing
        or plays the wrong role."""
        ...


class EndpointExtractor(Plugin, Protocol):
    def extract(self, event: EndpointEvent) -> None:
        """React to an endpoint being added, updated or deleted."""
        ...


class MetricsExtractor(Plugin, Protocol):
    def extract_metrics(self, endpoint: Endpoint, payload: bytes, now: float) -> None:
        """Turn one polled ``/metrics`` body into endpoint data; raise ValueError when the
        payload lacks what this extractor needs (counted as an extract error)."""
        ...

    def forget_endpoint(self, endpoint_id: str) -> None:
        """The endpoint is gone: drop what was extracted for it."""
        ...


class EndpointSource(Plugin, Protocol):
    """Forwards endpoint lifecycle events to its extractors (``endpoint-notification-source``)."""

    #: Given at construction: the loader builds a source after the extractors it feeds.
    extractors: tuple[EndpointExtractor, ...]

    def on_endpoint_event(self, event: EndpointEvent) -> None: ...


class PollingSource(Plugin, Protocol):
    """Polls every endpoint and hands each payload to its extractors (``metrics-data-source``)."""

    #: Given at construction: the loader builds a source after the extractors it feeds.
    extractors: tuple[MetricsExtractor, ...]

    def on_endpoint_event(self, event: EndpointEvent) -> None: ...


class RequestParser(Plugin, Protocol):
    def claims(self) -> tuple[str, ...] | None:
        """Request-path suffixes this parser handles; None: every path (passthrough)."""
        ...


class RequestArrival(Plugin, Protocol):
    def request_arrived(self) -> None:
        """A request's headers arrived and its body follows: start what its decision will read
        (the KV-event thread reads the messages its batch window gathered). Cheap, never raises."""
        ...


class PreRequest(Plugin, Protocol):
    def pre_request(self, ctx: SchedulingContext, result: SchedulingResult) -> None:
        """After the pick, before the request is forwarded (not called on dry runs)."""
        ...


class AsyncPreRequest(Plugin, Protocol):
    """A pre-request hook that waits on I/O (a shared store's write): the router awaits it after
    the synchronous hooks, before the destination is answered, so what it records is visible to
    other replicas by the time the client sees the response. It bounds itself and never raises."""

    async def pre_request_async(self, ctx: SchedulingContext, result: SchedulingResult) -> None: ...


class ResponseComplete(Plugin, Protocol):
    def response_complete(self, ctx: SchedulingContext, info: ResponseInfo) -> None:
        """The response ended, failed or the stream was cancelled: release per-request state."""
        ...


class ResponseHeaderProcessor(Plugin, Protocol):
    def response_headers(
        self, ctx: SchedulingContext, result: SchedulingResult, served: EndpointId
    ) -> list[tuple[str, str]]:
        """Headers to set on the client's response (llm-d's ``ResponseHeaderProcessor``), once the
        engine's response headers arrive; ``served`` is the target that answered."""
        ...


class Lifecycle(Plugin, Protocol):
    """Plugins that own threads, sockets or tasks start with the service and stop with it."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class CrossReplicaSyncer(Plugin, Protocol):
    """Shares what one replica knows with the others (llm-d's ``CrossReplicaSyncer``); every method
    fails open: a store that is down or slow leaves the replica on its local state."""

    def configure(self, sync_interval_seconds: float, publish_timeout_seconds: float) -> None:
        """``dataLayer.crossReplicaSyncInterval`` and ``crossReplicaPublishTimeout``, before start."""
        ...

    async def coordinate(self, ctx: SchedulingContext, result: SchedulingResult) -> SchedulingResult:
        """After the local pick, before any pre-request hook: the result to route with (``result``
        itself, or one whose primary target is the endpoint another replica already chose for this
        prompt's prefix). Never raises; bounded by its own timeout."""
        ...


class Ticker(Plugin, Protocol):
    def tick(self, now: float) -> float | None:
        """Housekeeping on the service's clock (e.g. expiring speculative entries). Returns when
        it is next due on that clock; None: at the service's default interval."""
        ...


@dataclass(frozen=True, slots=True)
class PluginState:
    """A plugin's state for ``/debug/state`` and the scrape-time metrics."""

    name: str
    type_name: str
    index: IndexStats | None = None
    #: Request keys each endpoint holds an entry for (only in a detailed view: O(index)).
    entries_per_endpoint: Mapping[str, int] | None = None
    speculative_pending: int | None = None
    kv_events: IngestStats | None = None
    #: A token producer's (backend, outcome → requests): ``ppc_extproc_tokenize_total``.
    tokenize: tuple[str, Mapping[str, int]] | None = None
    #: A disaggregation handler's counters, ``(family, model, decision)`` → requests: family
    #: ``pd`` / ``disagg`` (llm-d's decision families) or ``prefill_fallback`` (decision = reason).
    decisions: Mapping[tuple[str, str, str], int] | None = None
    #: Anything else worth showing, JSON-ready.
    details: Mapping[str, object] = field(default_factory=dict)
    #: A cross-replica syncer's store health: ``ppc_extproc_cross_replica_*``.
    cross_replica: CrossReplicaStats | None = None


@dataclass(frozen=True, slots=True)
class CrossReplicaStats:
    """A cross-replica syncer's view of its store, read at scrape time."""

    #: Subscribed and the last publish succeeded (claims run, peers' load counts).
    up: bool
    #: Other replicas heard from within the state TTL.
    peers: int
    #: outcome → routing decisions (adopted, kept, timeout, error, skipped).
    claims: Mapping[str, int]
    #: outcome → publishes of this replica's load (ok, error).
    syncs: Mapping[str, int]
    #: Peer messages that did not decode (dropped).
    malformed: int = 0


class StateReporter(Plugin, Protocol):
    def state(self, *, detailed: bool = False) -> PluginState: ...


class StreamingKeyProducer(Plugin, Protocol):
    """A producer whose block keys can be computed while a large token-id body streams in; it
    uses ``LLMRequest.streamed_keys`` when they carry its name and the request's model."""

    @property
    def streaming_processor(self) -> TokenProcessor: ...


class EndpointRegistry(Protocol):
    """What discovery writes to: the endpoint pool, the one owner of the endpoint lifecycle."""

    def replace(self, endpoints: Iterable[Endpoint]) -> list[EndpointEvent]: ...


class Discovery(Plugin, Protocol):
    async def run(self, registry: EndpointRegistry, stop: asyncio.Event) -> None:
        """Publish the first complete endpoint list (readiness waits for it), then keep it
        current until ``stop`` is set. Errors before the first list are fatal."""
        ...
