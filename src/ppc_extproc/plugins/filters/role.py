"""``decode-filter``: keep the endpoints that can decode, by their ``llm-d.ai/role`` label.

Type        ``decode-filter`` (filter)
Rule        keep an endpoint whose label ``llm-d.ai/role`` is absent or one of ``decode``,
            ``prefill-decode``, ``both`` (deprecated), ``encode-prefill-decode``; exact match, no
            trimming. Labels come from Kubernetes pod labels or ``labels`` in file-discovery
            entries; without labels every endpoint passes. Leaving nothing ⇒ 429.
Parameters  none

    plugins:
    - type: decode-filter
    schedulingProfiles:
    - name: default
      plugins: [{pluginRef: decode-filter}, {pluginRef: max-score-picker}]

The prefill and encode variants (P/D disaggregation) share these rules — prefill keeps ``prefill``,
``encode-prefill``, ``prefill-decode``, ``both``, ``encode-prefill-decode`` and drops unlabelled
endpoints; encode keeps ``encode``, ``encode-prefill``, ``encode-prefill-decode`` — but are not
offered: ppc-extproc runs no prefill/decode split. Follows
``llm-d/llm-d-router: pkg/epp/framework/plugins/scheduling/filter/bylabel/roles.go``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ppc_extproc.framework import Endpoint, Filter, SchedulingContext
from ppc_extproc.framework.params import Section
from ppc_extproc.plugins.registry import Services, register

__all__ = ["DECODE", "ENCODE", "PREFILL", "ROLE_LABEL", "DecodeFilter", "RoleRule"]

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


@register("decode-filter")
class DecodeFilter(Filter):
    rule = DECODE

    def __init__(self, name: str = "decode-filter") -> None:
        self.name = name

    @classmethod
    def from_parameters(cls, name: str, params: Section, services: Services) -> DecodeFilter:
        return cls(name)

    def filter(self, ctx: SchedulingContext, endpoints: Sequence[Endpoint]) -> list[Endpoint]:
        accepts = self.rule.accepts
        return [e for e in endpoints if accepts(e)]
