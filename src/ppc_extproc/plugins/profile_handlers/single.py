"""``single-profile-handler``: run the one scheduling profile; its pick is the destination.

Type        ``single-profile-handler`` (profile handler; injected when a configuration has exactly
            one profile and no handler, as llm-d does)
Behaviour   first call: every profile; afterwards none. The result must come from exactly one
            profile, which becomes the primary one; its targets are the destinations.
Parameters  none

    plugins:
    - type: single-profile-handler
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ppc_extproc.errors import SchedulingError
from ppc_extproc.framework import ProfileHandler, ProfileResult, SchedulingContext, SchedulingResult
from ppc_extproc.framework.params import Section
from ppc_extproc.plugins.registry import Services, register

__all__ = ["SingleProfileHandler", "every_profile_once", "sole_result"]


@register("single-profile-handler")
class SingleProfileHandler(ProfileHandler):
    def __init__(self, name: str = "single-profile-handler") -> None:
        self.name = name

    @classmethod
    def from_parameters(cls, name: str, params: Section, services: Services) -> SingleProfileHandler:
        return cls(name)

    def pick_profiles(
        self, ctx: SchedulingContext, profiles: Sequence[str], results: Mapping[str, ProfileResult]
    ) -> list[str]:
        return every_profile_once(profiles, results)

    def process_results(self, ctx: SchedulingContext, results: Mapping[str, ProfileResult]) -> SchedulingResult:
        name, result = sole_result(
            results,
            "single profile handler is intended to be used with a single profile, failed to process multiple profiles",
        )
        return SchedulingResult(name, results, result.targets, [e.id for e in result.targets])


def every_profile_once(profiles: Sequence[str], results: Mapping[str, ProfileResult]) -> list[str]:
    """First call: every profile; once they have run, none."""
    return [] if results else list(profiles)


def sole_result(results: Mapping[str, ProfileResult], error: str) -> tuple[str, ProfileResult]:
    """The one profile's name and result; ``SchedulingError(error)`` unless exactly one ran."""
    if len(results) != 1:
        raise SchedulingError(error)
    ((name, result),) = results.items()
    return name, result
