"""Plugin types registered by name, like llm-d's ``Register(pluginType, factory)``.

    @register("prefix-cache-scorer")
    class PrefixCacheScorer(Scorer, DataConsumer):
        @classmethod
        def from_parameters(cls, name: str, params: Section, services: Services) -> PrefixCacheScorer: ...

The factory reads its parameters from a strict ``Section`` (unknown keys are errors naming the
plugin and the key) and gets the shared services (clock, in-flight tracker, engine-metrics store).
A data source is built last, complete: ``from_wiring`` also gets the extractors it feeds and the
standing views of the data it declares in ``source_consumes`` (``SourceWiring``).
A type llm-d has but ppc-extproc does not is an error that says what the type does.
"""

from __future__ import annotations

import importlib
import inspect
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar, Protocol, TypeVar

from ppc_extproc.enginemetrics import AttributeStore, EngineMetricsStore
from ppc_extproc.errors import ConfigError
from ppc_extproc.framework import Consumes, EndpointSource, InFlightLoad, Plugin, PollingSource
from ppc_extproc.framework.params import Section
from ppc_extproc.plugins.unsupported import unsupported_message
from ppc_extproc.scheduling.health import EndpointHealth
from ppc_extproc.scheduling.inflight import InflightTracker

__all__ = [
    "PluginFactory",
    "Services",
    "SourceFactory",
    "SourceWiring",
    "create_plugin",
    "create_source",
    "plugin_doc",
    "register",
    "registered_types",
    "source_factory",
]


@dataclass
class Services:
    """Shared, process-wide things plugins may need. Tests inject their own."""

    clock: Callable[[], float] = time.monotonic
    #: Requests routed and not finished, per endpoint (llm-d's in-flight load).
    inflight: InflightTracker = field(default_factory=InflightTracker)
    #: Engine metrics per endpoint: metrics extractors write it, load scorers read it.
    engine_metrics: EngineMetricsStore = field(default_factory=EngineMetricsStore)
    #: Which endpoints may receive traffic: KV-event, metrics and response evidence.
    health: EndpointHealth = field(default_factory=EndpointHealth)
    #: Scalar endpoint attributes other extractors write (``dcgm-extractor``'s GPU utilisation).
    attributes: AttributeStore = field(default_factory=AttributeStore)


class PluginFactory(Protocol):
    type_name: str

    @classmethod
    def from_parameters(cls, name: str, params: Section, services: Services) -> Plugin: ...


@dataclass(frozen=True, slots=True)
class SourceWiring:
    """What a data source is built with, once the plugins it feeds and reads exist."""

    #: The extractors it feeds, already checked to fit the source's kind.
    extractors: tuple[Plugin, ...] = ()
    #: The in-flight load producer's standing view, when the source declares ``InFlightLoadDataKey``.
    in_flight: InFlightLoad | None = None


class SourceFactory(Protocol):
    """A data source type: built by the loader after its extractors (no wiring after the fact)."""

    type_name: str
    #: What the source reads outside requests; the loader makes sure each has a producer.
    source_consumes: ClassVar[tuple[Consumes[object], ...]]

    @classmethod
    def from_wiring(cls, name: str, params: Section, services: Services, wiring: SourceWiring) -> Plugin: ...


_REGISTRY: dict[str, type[PluginFactory]] = {}
_T = TypeVar("_T")

# Modules that register the built-in plugin types when imported.
_BUILTIN_MODULES = (
    "ppc_extproc.plugins.producers",
    "ppc_extproc.plugins.scorers",
    "ppc_extproc.plugins.pickers",
    "ppc_extproc.plugins.filters",
    "ppc_extproc.plugins.profile_handlers",
    "ppc_extproc.plugins.datalayer",
    "ppc_extproc.plugins.parsers",
    "ppc_extproc.plugins.flowcontrol",
    "ppc_extproc.discovery",
)


def register(type_name: str) -> Callable[[type[_T]], type[_T]]:
    """Class decorator: make a plugin type available to configurations under ``type_name``."""

    def decorate(cls: type[_T]) -> type[_T]:
        existing = _REGISTRY.get(type_name)
        if existing is not None and existing is not cls:
            raise RuntimeError(f"plugin type {type_name!r} registered twice")
        cls.type_name = type_name  # type: ignore[attr-defined]
        _REGISTRY[type_name] = cls  # type: ignore[assignment]
        return cls

    return decorate


def _load_builtins() -> None:
    for module in _BUILTIN_MODULES:
        importlib.import_module(module)


def registered_types() -> list[str]:
    """Every plugin type a configuration may use."""
    _load_builtins()
    return sorted(_REGISTRY)


def plugin_doc(type_name: str) -> str:
    """The documentation of a plugin type: its module's docstring (type, formula, parameters, YAML),
    or the class's own when one module registers several types."""
    _load_builtins()
    cls = _REGISTRY[type_name]
    own = inspect.cleandoc(cls.__doc__ or "")
    if own.startswith(f"``{type_name}``"):
        return own
    module = sys.modules[cls.__module__]
    return inspect.cleandoc(module.__doc__ or own)


def source_factory(type_name: str) -> type[SourceFactory] | None:
    """The registered class of ``type_name`` when it is a data source (built by ``create_source``)."""
    _load_builtins()
    cls = _REGISTRY.get(type_name)
    if cls is None or not (EndpointSource in cls.__mro__ or PollingSource in cls.__mro__):
        return None
    return cls  # type: ignore[return-value]


def create_source(
    type_name: str, name: str, params: Section, services: Services, wiring: SourceWiring
) -> Plugin:
    """Build a data source with what it feeds and reads (``source_factory`` says it is one)."""
    cls = source_factory(type_name)
    assert cls is not None, type_name
    plugin = cls.from_wiring(name, params, services, wiring)
    params.finish()
    return plugin


def create_plugin(type_name: str, name: str, params: Section, services: Services, *, path: str = "") -> Plugin:
    """Build a plugin from its configuration; ``ConfigError`` (at ``path``) for types ppc-extproc
    does not have and for bad parameters. Data sources are built by ``create_source``."""
    _load_builtins()
    cls = _REGISTRY.get(type_name)
    if cls is None:
        where = path or params.path.rsplit(".", 1)[0] + ".type"
        message = unsupported_message(type_name)
        if message is None:
            message = (
                f"plugin type {type_name!r} is not registered; supported types: {', '.join(sorted(_REGISTRY))}"
            )
        raise ConfigError(where, message)
    plugin = cls.from_parameters(name, params, services)
    params.finish()
    return plugin
