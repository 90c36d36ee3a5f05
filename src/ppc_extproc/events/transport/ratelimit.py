"""Rate-limited structlog warnings: one line per (event, endpoint) and interval, with a count."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

__all__ = ["RateLimitedLog"]

_MAX_KEYS = 10_000


class RateLimitedLog:
    """Logs ``event`` for ``endpoint`` at most once per ``interval_seconds``; later lines carry
    ``suppressed``, the number of occurrences not logged since the previous line."""

    def __init__(
        self,
        logger: Any,
        interval_seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._log = logger
        self._interval = interval_seconds
        self._clock = clock
        self._next: dict[tuple[str, str], float] = {}
        self._suppressed: dict[tuple[str, str], int] = {}

    def warning(self, event: str, endpoint: str, **data: Any) -> None:
        self._emit("warning", event, endpoint, data)

    def info(self, event: str, endpoint: str, **data: Any) -> None:
        self._emit("info", event, endpoint, data)

    def _emit(self, level: str, event: str, endpoint: str, data: dict[str, Any]) -> None:
        key = (event, endpoint)
        now = self._clock()
        if now < self._next.get(key, 0.0):
            self._suppressed[key] = self._suppressed.get(key, 0) + 1
            return
        if len(self._next) >= _MAX_KEYS:
            self._next.clear()
            self._suppressed.clear()
        self._next[key] = now + self._interval
        suppressed = self._suppressed.pop(key, 0)
        getattr(self._log, level)(event, endpoint=endpoint, suppressed=suppressed, **data)
