"""A one-line progress display on stderr (no dependency).

On a terminal the line is redrawn in place; otherwise a plain line is printed every
``plain_interval_s`` seconds so logs stay readable.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

from ppc_extproc_lab.workload.runner import Progress

__all__ = ["ProgressLine"]

_BAR = 24


class ProgressLine:
    """Callable for ``WorkloadRunner(on_progress=...)``; call :meth:`close` when the run ends."""

    def __init__(self, label: str, stream: TextIO | None = None, *, plain_interval_s: float = 10.0) -> None:
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty()
        self.plain_interval_s = plain_interval_s
        self._last_plain = -float("inf")
        self._width = 0
        self._last: Progress | None = None
        self._last_printed = True

    def render(self, p: Progress) -> str:
        total = max(p.schedule_s, 1e-9)
        frac = min(1.0, p.elapsed_s / total)
        filled = int(frac * _BAR)
        hit = f"{100 * p.cached_tokens / p.prompt_tokens:4.1f}%" if p.prompt_tokens else "  -  "
        return (
            f"{self.label:<14} [{'#' * filled}{'.' * (_BAR - filled)}] {p.elapsed_s:5.1f}/{p.schedule_s:.0f}s"
            f"  sent {p.sent}/{p.scheduled}  done {p.completed}  in-flight {p.in_flight}"
            f"  errors {p.errors}  hit {hit}"
        )

    def __call__(self, p: Progress) -> None:
        self._last, self._last_printed = p, False
        text = self.render(p)
        if self.tty:
            pad = max(0, self._width - len(text))
            self.stream.write("\r" + text + " " * pad)
            self._width = len(text)
        else:
            now = time.monotonic()
            if now - self._last_plain < self.plain_interval_s:
                return
            self._last_plain = now
            self.stream.write(text + "\n")
        self._last_printed = True
        self.stream.flush()

    def close(self) -> None:
        """Show the last snapshot (if throttled away) and end the line."""
        if not self.tty and self._last is not None and not self._last_printed:
            self._last_plain = -float("inf")
            self(self._last)
        if self.tty and self._last is not None:
            self.stream.write("\n")
            self.stream.flush()
