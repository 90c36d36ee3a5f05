"""Shared parts of the pickers: the ``maxNumOfEndpoints`` parameter and a locked RNG."""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass
from typing import Self

from ppc_extproc.framework import Picker
from ppc_extproc.framework.params import Section, decode, param
from ppc_extproc.plugins.registry import Services

__all__ = ["BasePicker", "PickerConfig", "max_num_of_endpoints"]


@dataclass(frozen=True, slots=True)
class PickerConfig:
    """A picker's parameters."""

    max_num_of_endpoints: int = param("maxNumOfEndpoints", 1)


def max_num_of_endpoints(name: str, params: Section) -> int:
    """``maxNumOfEndpoints`` (default 1); ≤ 0 becomes 1 with a warning, as llm-d silently does."""
    value = decode(params, PickerConfig).max_num_of_endpoints
    if value <= 0:
        params.warn("maxNumOfEndpoints", f"{value} is replaced by 1 (llm-d does the same silently)")
        return 1
    return value


class BasePicker(Picker):
    def __init__(self, name: str, max_endpoints: int = 1, rng: random.Random | None = None) -> None:
        self.name = name
        self.max_endpoints = max_endpoints
        self._rng = rng or random.Random()
        self._lock = threading.Lock()

    @classmethod
    def from_parameters(cls, name: str, params: Section, services: Services) -> Self:
        return cls(name, max_num_of_endpoints(name, params))
