"""Pickers: choose the destination endpoint(s) from the weighted totals."""

from __future__ import annotations

from ppc_extproc.plugins.pickers.max_score import MaxScorePicker
from ppc_extproc.plugins.pickers.random_picker import RandomPicker
from ppc_extproc.plugins.pickers.round_robin import RoundRobinPicker
from ppc_extproc.plugins.pickers.weighted_random import WeightedRandomPicker

__all__ = ["MaxScorePicker", "RandomPicker", "RoundRobinPicker", "WeightedRandomPicker"]
