"""Typed plugin configs: a frozen dataclass of ``param`` fields decodes with ``Section``'s errors."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from ppc_extproc.errors import ConfigError
from ppc_extproc.framework.params import Section, decode, param
from ppc_extproc.plugins.scorers.active_request import ActiveRequestConfig


@dataclass(frozen=True, slots=True)
class Example:
    size: int = param("size", 4, minimum=1)
    ratio: float = param("ratio", 0.5, maximum=1.0)
    on: bool = param("on", False)
    mode: str = param("mode", "a", choices=("a", "b"))


def test_defaults_values_and_case_folded_keys() -> None:
    assert decode(Section({}, "p"), Example) == Example()
    section = Section({"Size": 8, "ratio": 1, "on": True, "mode": "b"}, "plugins[0].parameters", fold_case=True)
    assert decode(section, Example) == Example(8, 1.0, True, "b")
    section.finish()  # every key was read


@pytest.mark.parametrize(("data", "message"), [
    ({"size": 0}, "plugins[0].parameters.size: must be at least 1, got 0"),
    ({"ratio": "x"}, "plugins[0].parameters.ratio: expected a number, got str"),
    ({"on": 1}, "plugins[0].parameters.on: expected true or false, got int"),
    ({"mode": "c"}, "plugins[0].parameters.mode: must be one of 'a', 'b'; got 'c'"),
])
def test_errors_name_the_field_path(data: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        decode(Section(data, "plugins[0].parameters"), Example)
    assert str(caught.value) == message


def test_unknown_keys_are_still_an_error_after_decoding() -> None:
    section = Section({"idleThreshold": 2, "idle": 1}, "plugins[0].parameters", "active-request-scorer")
    assert decode(section, ActiveRequestConfig).idle_threshold == 2
    with pytest.raises(ConfigError, match="unknown key 'idle' of active-request-scorer"):
        section.finish()
