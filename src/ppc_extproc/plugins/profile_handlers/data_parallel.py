"""``data-parallel-profile-handler``: one address per pod on the wire, the data-parallel rank in a
header, for llm-d's routing sidecar (deprecated in llm-d).

Type        ``data-parallel-profile-handler`` (profile handler)
Behaviour   runs the single profile. The picked endpoint's rank address goes into the request
            header ``x-data-parallel-host-port: <ip>:<rank port>``; every destination is rewritten
            to ``<ip>:<primaryPort>`` (the sidecar listens there and forwards to the rank). Match
            info, speculative entries and in-flight accounting keep the rank's own id
            (``ip:rankPort``) — llm-d seeds speculative entries under the rewritten port, which no
            KV event ever confirms.
Parameters  ``primaryPort`` [8000; 1–65535; ``0`` is accepted as llm-d accepts it, and means the
            default (llm-d would send to port 0)]

    plugins:
    - type: data-parallel-profile-handler
      parameters: {primaryPort: 8000}

Prefer ``single-profile-handler`` with one endpoint per rank (every rank is its own destination).
Follows ``llm-d/llm-d-router: pkg/epp/framework/plugins/scheduling/profilehandler/dataparallel/``
and ``pkg/common/routing/common.go`` for the header name.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ppc_extproc.errors import ConfigError
from ppc_extproc.framework import ProfileHandler, ProfileResult, SchedulingContext, SchedulingResult
from ppc_extproc.framework.params import Section
from ppc_extproc.ids import destination_host_port, endpoint_id
from ppc_extproc.plugins.profile_handlers.single import every_profile_once, sole_result
from ppc_extproc.plugins.registry import Services, register

__all__ = ["DATA_PARALLEL_HEADER", "DataParallelProfileHandler"]

DATA_PARALLEL_HEADER = "x-data-parallel-host-port"


@register("data-parallel-profile-handler")
class DataParallelProfileHandler(ProfileHandler):
    def __init__(self, name: str = "data-parallel-profile-handler", primary_port: int = 8000) -> None:
        self.name = name
        self.primary_port = primary_port

    @classmethod
    def from_parameters(cls, name: str, params: Section, services: Services) -> DataParallelProfileHandler:
        port = params.integer("primaryPort", 8000)
        if port == 0:
            params.warn("primaryPort", "0 means the default 8000 here (llm-d accepts it and sends to port 0)")
            port = 8000
        if not 1 <= port <= 65535:
            raise ConfigError(
                params.child_path("primaryPort"), f"invalid primaryPort: must be between 1 and 65535, got {port}"
            )
        params.warn("", "data-parallel-profile-handler is deprecated (llm-d: use single-profile-handler "
                    "with Istio >= 1.28.1, or one endpoint per rank)")
        return cls(name, port)

    def pick_profiles(
        self, ctx: SchedulingContext, profiles: Sequence[str], results: Mapping[str, ProfileResult]
    ) -> list[str]:
        return every_profile_once(profiles, results)

    def process_results(self, ctx: SchedulingContext, results: Mapping[str, ProfileResult]) -> SchedulingResult:
        name, result = sole_result(results, "data-parallel profile handler runs exactly one scheduling profile")
        targets = result.targets
        destinations = [endpoint_id(e.address, self.primary_port) for e in targets]
        headers = [(DATA_PARALLEL_HEADER, destination_host_port(targets[0].id))] if targets else []
        return SchedulingResult(name, results, targets, destinations, headers)
