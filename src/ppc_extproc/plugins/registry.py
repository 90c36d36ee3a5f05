"""Plugin types registered by name, like llm-d's ``Register(pluginType, factory)``.

    @register("prefix-cache-scorer")
    class PrefixCacheScorer:
        @classmethod
        def from_parameters(cls, name: str, params: Section, services: Services) -> PrefixCacheScorer: ...

The factory reads its parameters from a strict ``Section`` (unknown keys are errors naming the
plugin and the key) and gets shared services (clock, in-flight tracker, engine metrics).
"""

from __future__ import annotations

import importlib
import inspect
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from ppc_extproc.config.strict import Section
from ppc_extproc.errors import ConfigError

if TYPE_CHECKING:
    from ppc_extproc.enginemetrics import EngineMetricsReader
    from ppc_extproc.scheduling.inflight import InflightTracker

__all__ = ["PluginFactory", "Services", "create_plugin", "plugin_doc", "register", "registered_types"]


@dataclass
class Services:
    """Shared, process-wide things plugins may need. Tests inject their own."""

    clock: Callable[[], float] = time.monotonic
    #: Other plugins by name, filled in by the loader in config order (for references by name).
    plugins: dict[str, Any] = field(default_factory=dict)
    #: Set by the server: in-flight requests/tokens per endpoint (see ``scheduling.inflight``).
    inflight: Any = None
    #: Engine metrics per endpoint (an ``enginemetrics.EngineMetricsReader``). The server may set
    #: its own ``EngineMetricsSource`` before loading the config; otherwise the first plugin that
    #: asks through ``engine_metrics_source()`` creates one with default options. Either way the
    #: server starts it: ``attach(pool)``, ``await start()``; ``await stop()`` on shutdown.
    engine_metrics: EngineMetricsReader | None = None

    def engine_metrics_source(self) -> EngineMetricsReader:
        """The one shared engine metrics reader, created (not started) on first use."""
        if self.engine_metrics is None:
            from ppc_extproc.enginemetrics import EngineMetricsSource

            self.engine_metrics = EngineMetricsSource(clock=self.clock)
        return self.engine_metrics

    def inflight_tracker(self) -> InflightTracker:
        """The one shared ``InflightTracker``, created on first use."""
        if self.inflight is None:
            from ppc_extproc.scheduling.inflight import InflightTracker

            self.inflight = InflightTracker(clock=self.clock)
        tracker: InflightTracker = self.inflight
        return tracker


class PluginFactory(Protocol):
    type_name: str

    @classmethod
    def from_parameters(cls, name: str, params: Section, services: Services) -> Any: ...


_REGISTRY: dict[str, type[Any]] = {}
_T = TypeVar("_T")

# Modules that register the built-in plugin types when imported.
_BUILTIN_MODULES = (
    "ppc_extproc.plugins.producers",
    "ppc_extproc.plugins.scorers",
    "ppc_extproc.plugins.pickers",
    "ppc_extproc.plugins.filters",
    "ppc_extproc.discovery",
)


def register(type_name: str) -> Callable[[type[_T]], type[_T]]:
    """Class decorator: make a plugin type available to configurations under ``type_name``."""

    def decorate(cls: type[_T]) -> type[_T]:
        existing = _REGISTRY.get(type_name)
        if existing is not None and existing is not cls:
            raise RuntimeError(f"plugin type {type_name!r} registered twice")
        cls.type_name = type_name  # type: ignore[attr-defined]
        _REGISTRY[type_name] = cls
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
    """The documentation of a plugin type: its module's docstring (type, formula, parameters, YAML)."""
    _load_builtins()
    cls = _REGISTRY[type_name]
    module = sys.modules[cls.__module__]
    return inspect.cleandoc(module.__doc__ or cls.__doc__ or "")


def create_plugin(type_name: str, name: str, params: Section, services: Services) -> Any:
    """Build a plugin from its configuration; ``ConfigError`` for unknown types or parameters."""
    _load_builtins()
    cls = _REGISTRY.get(type_name)
    if cls is None:
        raise ConfigError(
            params.path.rsplit(".", 1)[0] + ".type",
            f"unsupported plugin type {type_name!r}; supported types: {', '.join(sorted(_REGISTRY))}",
        )
    plugin = cls.from_parameters(name, params, services)
    params.finish()
    return plugin
