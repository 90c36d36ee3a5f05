"""Shared parts of the pickers: the ``maxNumOfEndpoints`` parameter and a locked RNG."""

from __future__ import annotations

import random
import threading

from ppc_extproc.config.strict import Section
from ppc_extproc.plugins.registry import Services

__all__ = ["BasePicker"]


class BasePicker:
    type_name: str

    def __init__(self, name: str, max_endpoints: int = 1, rng: random.Random | None = None) -> None:
        self.name = name
        self.max_endpoints = max_endpoints
        self._rng = rng or random.Random()
        self._lock = threading.Lock()

    @classmethod
    def from_parameters(cls, name: str, params: Section, services: Services) -> BasePicker:
        return cls(name, params.integer("maxNumOfEndpoints", 1, minimum=1))
