"""Profile handlers: which scheduling profiles run for a request, and what their results mean."""

from __future__ import annotations

from ppc_extproc.plugins.profile_handlers.data_parallel import DataParallelProfileHandler
from ppc_extproc.plugins.profile_handlers.deciders import (
    AlwaysDisaggMultimodalDecider,
    AlwaysDisaggPDDecider,
    PrefixBasedPDDecider,
)
from ppc_extproc.plugins.profile_handlers.disagg import DisaggProfileHandler
from ppc_extproc.plugins.profile_handlers.disagg_legacy import (
    DisaggHeadersHandler,
    PdProfileHandler,
    PrefillHeaderHandler,
)
from ppc_extproc.plugins.profile_handlers.single import SingleProfileHandler

__all__ = [
    "AlwaysDisaggMultimodalDecider",
    "AlwaysDisaggPDDecider",
    "DataParallelProfileHandler",
    "DisaggHeadersHandler",
    "DisaggProfileHandler",
    "PdProfileHandler",
    "PrefillHeaderHandler",
    "PrefixBasedPDDecider",
    "SingleProfileHandler",
]
