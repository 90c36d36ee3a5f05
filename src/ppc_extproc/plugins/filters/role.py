"""Role filters: keep the endpoints that can play a stage, by their ``llm-d.ai/role`` label.

Types       ``decode-filter``, ``prefill-filter``, ``encode-filter`` (filters)
Rule        exact match of the label ``llm-d.ai/role``, no trimming:
            decode   ``decode``, ``prefill-decode``, ``both`` (deprecated), ``encode-prefill-decode``,
                     and endpoints without the label
            prefill  ``prefill``, ``encode-prefill``, ``prefill-decode``, ``both``,
                     ``encode-prefill-decode``; unlabelled endpoints are dropped
            encode   ``encode``, ``encode-prefill``, ``encode-prefill-decode``; unlabelled dropped
            Labels come from Kubernetes pod labels or ``labels`` in file-discovery entries.
            Leaving nothing ⇒ 429 in a request's primary profile; in a P/D handler's prefill or
            encode profile the stage is skipped instead (the decode engine prefills locally).
Parameters  none

    plugins:
    - type: decode-filter
    - type: prefill-filter
    schedulingProfiles:
    - name: decode
      plugins: [{pluginRef: decode-filter}, {pluginRef: max-score-picker}]
    - name: prefill
      plugins: [{pluginRef: prefill-filter}, {pluginRef: max-score-picker}]

Follows ``llm-d/llm-d-router: pkg/epp/framework/plugins/scheduling/filter/bylabel/roles.go``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ppc_extproc.framework import Endpoint, Filter, SchedulingContext
from ppc_extproc.framework.params import Section
from ppc_extproc.plugins.registry import Services, register

__all__ = ["DECODE", "ENCODE", "PREFILL", "ROLE_LABEL", "DecodeFilter", "EncodeFilter", "PrefillFilter", "RoleFilter", "RoleRule"]

ROLE_LABEL = "llm-d.ai/role"


@dataclass(frozen=True, slots=True)
class RoleRule:
    """Which ``llm-d.ai/role`` values a stage accepts, and whether unlabelled endpoints pass."""

    roles: frozenset[str]
    keep_unlabelled: bool

    def accepts(self, endpoint: Endpoint) -> bool:
        role = endpoint.label(ROLE_LABEL)
        return self.keep_unlabelled if role is None else role in self.roles


DECODE = RoleRule(frozenset({"decode", "prefill-decode", "both", "encode-prefill-decode"}), keep_unlabelled=True)
PREFILL = RoleRule(
    frozenset({"prefill", "encode-prefill", "prefill-decode", "both", "encode-prefill-decode"}), keep_unlabelled=False
)
ENCODE = RoleRule(frozenset({"encode", "encode-prefill", "encode-prefill-decode"}), keep_unlabelled=False)


class RoleFilter(Filter):
    """Keeps the endpoints whose role label its ``rule`` accepts."""

    rule: RoleRule = DECODE

    def __init__(self, name: str = "") -> None:
        self.name = name or self.type_name

    @classmethod
    def from_parameters(cls, name: str, params: Section, services: Services) -> RoleFilter:
        return cls(name)

    def filter(self, ctx: SchedulingContext, endpoints: Sequence[Endpoint]) -> list[Endpoint]:
        accepts = self.rule.accepts
        return [e for e in endpoints if accepts(e)]


@register("decode-filter")
class DecodeFilter(RoleFilter):
    """``decode-filter``: keep endpoints whose ``llm-d.ai/role`` is absent or ``decode``, ``prefill-decode``, ``both``, ``encode-prefill-decode``.

    Type        ``decode-filter`` (filter); the rules of all three are in this module's docstring
    Parameters  none

        plugins:
        - type: decode-filter
    """

    rule = DECODE


@register("prefill-filter")
class PrefillFilter(RoleFilter):
    """``prefill-filter``: keep endpoints whose ``llm-d.ai/role`` is ``prefill``, ``encode-prefill``, ``prefill-decode``, ``both``, ``encode-prefill-decode`` (unlabelled dropped).

    Type        ``prefill-filter`` (filter); the rules of all three are in this module's docstring
    Parameters  none

        plugins:
        - type: prefill-filter
    """

    rule = PREFILL


@register("encode-filter")
class EncodeFilter(RoleFilter):
    """``encode-filter``: keep endpoints whose ``llm-d.ai/role`` is ``encode``, ``encode-prefill``, ``encode-prefill-decode`` (unlabelled dropped).

    Type        ``encode-filter`` (filter); the rules of all three are in this module's docstring
    Parameters  none

        plugins:
        - type: encode-filter
    """

    rule = ENCODE
