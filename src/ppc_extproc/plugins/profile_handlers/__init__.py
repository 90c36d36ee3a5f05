"""Profile handlers: which scheduling profiles run for a request, and what their results mean."""

from __future__ import annotations

from ppc_extproc.plugins.profile_handlers.data_parallel import DataParallelProfileHandler
from ppc_extproc.plugins.profile_handlers.single import SingleProfileHandler

__all__ = ["DataParallelProfileHandler", "SingleProfileHandler"]
