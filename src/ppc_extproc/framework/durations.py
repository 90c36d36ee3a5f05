"""Go duration strings (``"2s"``, ``"1m30s"``, ``"250ms"``), as llm-d's configuration uses them."""

from __future__ import annotations

import re

__all__ = ["parse_go_duration"]

_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


def parse_go_duration(text: str) -> float:
    """Seconds in a Go duration string. Raises ValueError on anything Go's ParseDuration rejects."""
    s = text.strip()
    sign = 1.0
    if s[:1] in "+-" and s:
        sign = -1.0 if s[0] == "-" else 1.0
        s = s[1:]
    if s == "0":
        return 0.0
    if not s:
        raise ValueError(f"invalid duration {text!r}")
    total, pos = 0.0, 0
    while pos < len(s):
        match = _PART.match(s, pos)
        if match is None:
            raise ValueError(f"invalid duration {text!r} (use e.g. 2s, 500ms, 1m30s)")
        total += float(match.group(1)) * _UNITS[match.group(2)]
        pos = match.end()
    return sign * total
