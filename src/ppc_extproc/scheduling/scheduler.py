"""The scheduling cycle: the profile handler picks profiles, they run, it interprets the results.

    loop: names = handler.pick_profiles(ctx, profiles, results); stop when empty; run each
    result = handler.process_results(ctx, results)

As llm-d's ``Scheduler.Schedule`` (``llm-d/llm-d-router: pkg/epp/scheduling/scheduler.go``), with a
bound on the rounds so a handler that keeps asking cannot loop forever. A profile whose filters
leave nothing has a result with no targets (llm-d: a nil result), so a P/D handler can go on
without its prefill stage; the request fails with that profile's error only when it is the
primary one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ppc_extproc.errors import SaturatedError, SchedulingError
from ppc_extproc.framework import Endpoint, ProfileHandler, ProfileResult, SchedulingContext, SchedulingResult
from ppc_extproc.scheduling.profile import SchedulingProfile

__all__ = ["Scheduler"]

_MAX_ROUNDS = 8


class Scheduler:
    def __init__(self, profiles: Mapping[str, SchedulingProfile], handler: ProfileHandler) -> None:
        self.profiles = dict(profiles)
        self.handler = handler
        self._names = list(self.profiles)

    def schedule(self, ctx: SchedulingContext, candidates: Sequence[Endpoint]) -> SchedulingResult:
        results: dict[str, ProfileResult] = {}
        failures: dict[str, SaturatedError] = {}
        for _ in range(_MAX_ROUNDS):
            names = self.handler.pick_profiles(ctx, self._names, results)
            if not names:
                break
            for name in names:
                profile = self.profiles.get(name)
                if profile is None:
                    raise SchedulingError(f"profile handler {self.handler.name} picked unknown profile {name!r}")
                try:
                    results[name] = profile.run(ctx, candidates)
                except SaturatedError as exc:
                    if not self.handler.multi_profile:
                        raise
                    results[name] = ProfileResult(targets=[])
                    failures[name] = exc
        if not results:
            raise SchedulingError(
                f"failed to find target endpoint: failed to run any scheduler profile for request "
                f"{ctx.request.request_id}"
            )
        result = self.handler.process_results(ctx, results)
        if not result.targets and result.primary_profile in failures:
            raise failures[result.primary_profile]
        if not result.targets:
            raise SchedulingError(f"failed to find target endpoint: profile {result.primary_profile!r} picked none")
        return result
