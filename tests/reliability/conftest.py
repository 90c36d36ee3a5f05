"""The fault suite: every test states what it tried; the session prints the totals."""

from __future__ import annotations

from typing import Any

import fault_tally as tally


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not tally.counts:
        return
    terminalreporter.section(f"reliability (PPC_RELIABILITY_SCALE={tally.SCALE})")
    for name, n in sorted(tally.counts.items()):
        terminalreporter.write_line(f"{name:<48} {n:>12,}")
