"""The spec's machine-readable vectors (copied into tests/fixtures/vectors)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

VECTORS = Path(__file__).parent / "fixtures" / "vectors"


def load_vectors(name: str) -> Any:
    return json.loads((VECTORS / name).read_text())


def token_range(spec: str | list[int]) -> list[int]:
    """``"a..b"`` (inclusive) or a list, as the vector files write token lists."""
    if isinstance(spec, list):
        return spec
    start, end = spec.split("..")
    return list(range(int(start), int(end) + 1))
