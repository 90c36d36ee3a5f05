"""Strict decoding of configuration mappings: every error names the dotted path of the field.

    section = Section(params, "plugins[1].parameters", owner="precise-prefix-cache-producer")
    size = section.integer("size", 100, minimum=1)
    section.finish()   # unknown keys are an error naming the key and the owner
    section.warn("blockSize", "deprecated; use blockSizeTokens")   # collected for the loader

With ``fold_case`` (plugin parameters, and every section under them) keys also match
case-insensitively, as Go's ``encoding/json`` decodes llm-d's parameters: an exact match wins
over a case-folded one.

A plugin's parameters as one typed config: a frozen dataclass whose fields say their document key
and bounds, decoded with the same errors::

    @dataclass(frozen=True, slots=True)
    class Config:
        idle_threshold: int = param("idleThreshold", 0, minimum=0)

    config = decode(section, Config)

Checks across fields (and the errors they raise, naming the field with ``section.child_path``)
stay in the plugin's factory, after ``decode``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any, TypeVar, get_type_hints

from ppc_extproc.errors import ConfigError
from ppc_extproc.framework.durations import parse_go_duration

__all__ = ["Section", "decode", "param"]

_MISSING = object()
_C = TypeVar("_C")


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


class Section:
    """One mapping of a configuration document, read field by field."""

    def __init__(
        self,
        data: Any,
        path: str,
        owner: str | None = None,
        warnings: list[str] | None = None,
        *,
        fold_case: bool = False,
    ) -> None:
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise ConfigError(path, f"expected a mapping, got {_type_name(data)}")
        self.data: dict[str, Any] = data
        self.path = path
        self.owner = owner
        #: Shared by every section of one document: accepted-but-questionable inputs.
        self.warnings: list[str] = warnings if warnings is not None else []
        self._seen: set[str] = set()
        self.fold_case = fold_case

    def warn(self, key: str, message: str) -> None:
        """Record a warning about ``key`` (deprecated, ignored or replaced values)."""
        where = self.child_path(key) if key else self.path
        self.warnings.append(f"{where}: {message}" if where else message)

    def sub(self, data: Any, path: str, owner: str | None = None, *, fold_case: bool | None = None) -> Section:
        """Another mapping of the same document (warnings go to the same list; case folding as
        this section's unless given)."""
        fold = self.fold_case if fold_case is None else fold_case
        return Section(data, path, owner or self.owner, self.warnings, fold_case=fold)

    def child_path(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def _key(self, key: str) -> str:
        """The document's spelling of ``key`` (marked as read): exact, else case-folded."""
        if key not in self.data and self.fold_case:
            folded = key.casefold()
            for candidate in self.data:
                if isinstance(candidate, str) and candidate.casefold() == folded:
                    key = candidate
                    break
        self._seen.add(key)
        return key

    def has(self, key: str) -> bool:
        key = self._key(key)
        return key in self.data and self.data[key] is not None

    def raw(self, key: str, default: Any = None) -> Any:
        value = self.data.get(self._key(key), _MISSING)
        return default if value is _MISSING or value is None else value

    def integer(self, key: str, default: int, *, minimum: int | None = None, maximum: int | None = None) -> int:
        value = self.raw(key, default)
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            else:
                raise ConfigError(self.child_path(key), f"expected an integer, got {_type_name(value)}")
        self._check_range(key, value, minimum, maximum)
        return value

    def number(self, key: str, default: float, *, minimum: float | None = None, maximum: float | None = None) -> float:
        value = self.raw(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(self.child_path(key), f"expected a number, got {_type_name(value)}")
        self._check_range(key, value, minimum, maximum)
        return float(value)

    def boolean(self, key: str, default: bool) -> bool:
        value = self.raw(key, default)
        if not isinstance(value, bool):
            raise ConfigError(self.child_path(key), f"expected true or false, got {_type_name(value)}")
        return value

    def string(self, key: str, default: str, *, choices: tuple[str, ...] | None = None) -> str:
        value = self.raw(key, default)
        if not isinstance(value, str):
            raise ConfigError(self.child_path(key), f"expected a string, got {_type_name(value)}")
        if choices is not None and value not in choices:
            allowed = ", ".join(repr(c) for c in choices if c)
            raise ConfigError(self.child_path(key), f"must be one of {allowed}; got {value!r}")
        return value

    def duration(self, key: str, default: str) -> float:
        """A Go duration string (or a number of seconds) as seconds."""
        value = self.raw(key, default)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if not isinstance(value, str):
            raise ConfigError(self.child_path(key), f"expected a duration such as \"2s\", got {_type_name(value)}")
        try:
            return parse_go_duration(value)
        except ValueError as exc:
            raise ConfigError(self.child_path(key), str(exc)) from None

    def section(self, key: str) -> Section:
        return self.sub(self.raw(key, {}), self.child_path(key))

    def items(self, key: str) -> Iterator[tuple[str, Any]]:
        """Elements of a list field with their paths (``key[i]``)."""
        value = self.raw(key, [])
        if not isinstance(value, list):
            raise ConfigError(self.child_path(key), f"expected a list, got {_type_name(value)}")
        for i, item in enumerate(value):
            yield f"{self.child_path(key)}[{i}]", item

    def reject(self, key: str, message: str) -> None:
        """Error if ``key`` is set."""
        if self.has(key):
            raise ConfigError(self.child_path(key), message)

    def finish(self) -> None:
        """Error on keys that no reader asked for."""
        unknown = sorted(set(self.data) - self._seen)
        if unknown:
            where = f" of {self.owner}" if self.owner else ""
            known = ", ".join(sorted(self._seen)) or "none"
            raise ConfigError(
                self.child_path(unknown[0]),
                f"unknown key {unknown[0]!r}{where} (known keys here: {known})",
            )

    def _check_range(self, key: str, value: float, minimum: float | None, maximum: float | None) -> None:
        if minimum is not None and value < minimum:
            raise ConfigError(self.child_path(key), f"must be at least {minimum}, got {value}")
        if maximum is not None and value > maximum:
            raise ConfigError(self.child_path(key), f"must be at most {maximum}, got {value}")


def param(
    key: str,
    default: Any,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    choices: tuple[str, ...] | None = None,
    duration: bool = False,
) -> Any:
    """A config field read from ``key`` (``int``, ``float``, ``bool`` or ``str`` by its annotation).
    ``duration``: a ``float`` of seconds written as a Go duration (``"50ms"``); ``default`` is the
    duration text."""
    text = default if duration else None
    return dataclasses.field(
        default=parse_go_duration(default) if duration else default,
        metadata={"key": key, "minimum": minimum, "maximum": maximum, "choices": choices, "duration": text},
    )


def decode(section: Section, config: type[_C]) -> _C:
    """Read every ``param`` field of the dataclass ``config`` from ``section`` (errors name the
    field's path, as ``Section``'s readers do)."""
    hints = get_type_hints(config)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(config):  # type: ignore[arg-type]
        meta = f.metadata
        if "key" not in meta:
            continue
        key, kind, default = meta["key"], hints[f.name], f.default
        if meta["duration"] is not None:
            values[f.name] = section.duration(key, meta["duration"])
        elif kind is bool:
            values[f.name] = section.boolean(key, default)  # type: ignore[arg-type]
        elif kind is int:
            values[f.name] = section.integer(key, default, minimum=meta["minimum"], maximum=meta["maximum"])  # type: ignore[arg-type]
        elif kind is float:
            values[f.name] = section.number(key, default, minimum=meta["minimum"], maximum=meta["maximum"])  # type: ignore[arg-type]
        elif kind is str:
            values[f.name] = section.string(key, default, choices=meta["choices"])  # type: ignore[arg-type]
        else:
            raise TypeError(f"{config.__name__}.{f.name}: unsupported parameter type {kind!r}")
    return config(**values)
