"""Classify plugins by role, once, at load time: every later use is typed by the role."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TypeGuard, TypeVar

from ppc_extproc.framework.roles import (
    AsyncDataProducer,
    AsyncPreRequest,
    DataConsumer,
    DataProducer,
    Discovery,
    EndpointExtractor,
    EndpointSource,
    Filter,
    Lifecycle,
    MetricsExtractor,
    Picker,
    Plugin,
    PluginReferences,
    PollingSource,
    PreRequest,
    ProfileHandler,
    RequestArrival,
    RequestParser,
    ResponseComplete,
    ResponseHeaderProcessor,
    Scorer,
    StateReporter,
    StreamingKeyProducer,
    Ticker,
)

__all__ = ["PluginRoles", "classify", "plays", "role_names"]

_R = TypeVar("_R")


@dataclass(slots=True)
class PluginRoles:
    """The plugins of one configuration, grouped by the roles they declare."""

    producers: list[DataProducer | AsyncDataProducer] = field(default_factory=list)
    consumers: list[DataConsumer] = field(default_factory=list)
    filters: list[Filter] = field(default_factory=list)
    scorers: list[Scorer] = field(default_factory=list)
    pickers: list[Picker] = field(default_factory=list)
    profile_handlers: list[ProfileHandler] = field(default_factory=list)
    endpoint_sources: list[EndpointSource] = field(default_factory=list)
    polling_sources: list[PollingSource] = field(default_factory=list)
    endpoint_extractors: list[EndpointExtractor] = field(default_factory=list)
    metrics_extractors: list[MetricsExtractor] = field(default_factory=list)
    request_arrival: list[RequestArrival] = field(default_factory=list)
    pre_request: list[PreRequest] = field(default_factory=list)
    pre_request_async: list[AsyncPreRequest] = field(default_factory=list)
    response_complete: list[ResponseComplete] = field(default_factory=list)
    response_headers: list[ResponseHeaderProcessor] = field(default_factory=list)
    lifecycle: list[Lifecycle] = field(default_factory=list)
    tickers: list[Ticker] = field(default_factory=list)
    state_reporters: list[StateReporter] = field(default_factory=list)
    streaming: list[StreamingKeyProducer] = field(default_factory=list)
    discovery: list[Discovery] = field(default_factory=list)
    parsers: list[RequestParser] = field(default_factory=list)
    references: list[PluginReferences] = field(default_factory=list)

    def add(self, plugin: Plugin) -> None:
        """Classify one plugin into every group of a role it declares (once: a plugin already
        present is not added again)."""
        for role, attr, _ in _ROLES:
            if plays(plugin, role):
                group: list[Plugin] = getattr(self, attr)
                if plugin not in group:
                    group.append(plugin)


# Role protocol → PluginRoles field, in the order roles are listed to users.
_ROLES: tuple[tuple[type, str, str], ...] = (
    (DataProducer, "producers", "producer"),
    (AsyncDataProducer, "producers", "producer"),
    (Filter, "filters", "filter"),
    (Scorer, "scorers", "scorer"),
    (Picker, "pickers", "picker"),
    (ProfileHandler, "profile_handlers", "profile handler"),
    (EndpointSource, "endpoint_sources", "endpoint data source"),
    (PollingSource, "polling_sources", "polling data source"),
    (EndpointExtractor, "endpoint_extractors", "endpoint extractor"),
    (MetricsExtractor, "metrics_extractors", "metrics extractor"),
    (Discovery, "discovery", "discovery"),
    (RequestParser, "parsers", "request parser"),
    (DataConsumer, "consumers", ""),
    (RequestArrival, "request_arrival", ""),
    (PreRequest, "pre_request", ""),
    (AsyncPreRequest, "pre_request_async", ""),
    (ResponseComplete, "response_complete", ""),
    (ResponseHeaderProcessor, "response_headers", ""),
    (Lifecycle, "lifecycle", ""),
    (Ticker, "tickers", ""),
    (StateReporter, "state_reporters", ""),
    (StreamingKeyProducer, "streaming", ""),
    (PluginReferences, "references", ""),
)


def plays(plugin: object, role: type[_R]) -> TypeGuard[_R]:
    """Whether ``plugin`` declares ``role`` by subclassing it. Nominal on purpose: a structural
    check would call a metrics source an endpoint source because both have ``extractors``."""
    return role in type(plugin).__mro__


def classify(plugins: Iterable[Plugin]) -> PluginRoles:
    roles = PluginRoles()
    for plugin in plugins:
        roles.add(plugin)
    return roles


def role_names(plugin: Plugin) -> list[str]:
    """The user-facing roles of a plugin (``producer``, ``scorer``, …), for messages."""
    names: list[str] = []
    for role, _, label in _ROLES:
        if label and label not in names and plays(plugin, role):
            names.append(label)
    return names
