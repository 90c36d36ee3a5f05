"""Pickers: choose the destination endpoint(s) from the weighted totals."""

from __future__ import annotations

from ppc_extproc.plugins.pickers.max_score import MaxScorePicker, RandomPicker, WeightedRandomPicker

__all__ = ["MaxScorePicker", "RandomPicker", "WeightedRandomPicker"]
