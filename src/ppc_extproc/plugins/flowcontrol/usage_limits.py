"""Usage-limit policies: a dispatch ceiling per active priority band from the pool's saturation;
a band dispatches while ``saturation < ceiling``
(``llm-d/llm-d-router: pkg/epp/framework/plugins/flowcontrol/usagelimits/``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ppc_extproc.errors import ConfigError
from ppc_extproc.flowcontrol.types import UsageLimitPolicy
from ppc_extproc.framework.params import Section, decode, param
from ppc_extproc.plugins.registry import Services, register

__all__ = ["PriorityHoldbackPolicy", "SoftReflectiveCeilingPolicy", "StaticUsageLimitPolicy"]


@register("static-usage-limit-policy")
class StaticUsageLimitPolicy(UsageLimitPolicy):
    """``static-usage-limit-policy``: one ceiling for every band.

    Type        ``static-usage-limit-policy`` (flow-control usage limit; injected when
                ``flowControl.usageLimitPolicyPluginRef`` is unset)
    Rule        every band's ceiling is ``threshold``
    Parameters  ``threshold`` [1.0], in (0, 1]

        plugins:
        - type: static-usage-limit-policy
          name: my-usage-limit
          parameters: {threshold: 0.8}
        flowControl:
          usageLimitPolicyPluginRef: my-usage-limit
    """

    type_name = "static-usage-limit-policy"

    def __init__(self, name: str, threshold: float = 1.0) -> None:
        self.name = name
        self.threshold = threshold

    @classmethod
    def from_parameters(cls, name: str, params: Section, services: Services) -> StaticUsageLimitPolicy:
        threshold = params.number("threshold", 1.0, maximum=1.0)
        if threshold <= 0:
            raise ConfigError(params.child_path("threshold"), f"must be in (0.0, 1.0], got {threshold}")
        return cls(name, threshold)

    def ceilings(self, saturation: float, priorities: Sequence[int]) -> Sequence[float]:
        return [self.threshold] * len(priorities)


@dataclass(frozen=True, slots=True)
class HoldbackConfig:
    shape: str = param("shape", "linear", choices=("linear",))
    domain: str = param("domain", "rank", choices=("rank", "value"))
    min_ceiling: float = param("minCeiling", -1.0)
    max_ceiling: float = param("maxCeiling", 1.0)


@register("priority-holdback-policy")
class PriorityHoldbackPolicy(UsageLimitPolicy):
    """``priority-holdback-policy``: lower priorities get lower, fixed ceilings.

    Type        ``priority-holdback-policy`` (flow-control usage limit)
    Rule        ``rank``: ``c_i = maxCeiling − i·(maxCeiling − minCeiling)/(N − 1)``, ``i`` the rank
                from the highest priority; ``value``: ``c = minCeiling + (p − pMin)/(pMax − pMin) ·
                (maxCeiling − minCeiling)``; one band (or equal priorities) ⇒ ``maxCeiling``
    Parameters  ``minCeiling`` (required, in [0, 1)), ``maxCeiling`` [1.0] (in (0, 1], ≥ minCeiling),
                ``shape`` [linear], ``domain`` [rank] (``rank`` or ``value``)

        plugins:
        - type: priority-holdback-policy
          name: my-holdback-policy
          parameters: {shape: linear, domain: rank, minCeiling: 0.4, maxCeiling: 0.9}
        flowControl:
          usageLimitPolicyPluginRef: my-holdback-policy
    """

    type_name = "priority-holdback-policy"

    def __init__(self, name: str, config: HoldbackConfig) -> None:
        self.name = name
        self.config = config

    @classmethod
    def from_parameters(cls, name: str, params: Section, services: Services) -> PriorityHoldbackPolicy:
        if not params.has("minCeiling"):
            raise ConfigError(params.child_path("minCeiling"), "is required (the ceiling of the lowest priority)")
        config = decode(params, HoldbackConfig)
        if not 0.0 <= config.min_ceiling < 1.0:
            raise ConfigError(params.child_path("minCeiling"), f"must be in [0.0, 1.0), got {config.min_ceiling}")
        if not 0.0 < config.max_ceiling <= 1.0:
            raise ConfigError(params.child_path("maxCeiling"), f"must be in (0.0, 1.0], got {config.max_ceiling}")
        if config.min_ceiling > config.max_ceiling:
            raise ConfigError(params.child_path("minCeiling"), "must not exceed maxCeiling")
        return cls(name, config)

    def ceilings(self, saturation: float, priorities: Sequence[int]) -> Sequence[float]:
        low, high = self.config.min_ceiling, self.config.max_ceiling
        n = len(priorities)
        if n <= 1:
            return [high] * n
        if self.config.domain == "rank":
            return [high - i * (high - low) / (n - 1) for i in range(n)]
        p_min, p_max = min(priorities), max(priorities)
        if p_max == p_min:
            return [high] * n
        return [low + (p - p_min) / (p_max - p_min) * (high - low) for p in priorities]


@register("soft-reflective-ceiling-policy")
class SoftReflectiveCeilingPolicy(UsageLimitPolicy):
    """``soft-reflective-ceiling-policy``: ceilings that tighten for lower bands as saturation rises.

    Type        ``soft-reflective-ceiling-policy`` (flow-control usage limit)
    Rule        band ``i`` of ``N`` (0 = highest): reflective ceiling ``1 − i·sat/(N − 1)``;
                ``sat`` below it ⇒ open (1.0); ``sat ≥ 1`` ⇒ closed (0.0); otherwise every gated band
                opens together on one call in ``round(sat/(1 − sat))`` (a shared tick), so its
                dispatch rate falls continuously with saturation; band 0 is always 1.0; one band ⇒ open
    Parameters  none (any parameter is an error)

        plugins:
        - type: soft-reflective-ceiling-policy
        flowControl:
          usageLimitPolicyPluginRef: soft-reflective-ceiling-policy
    """

    type_name = "soft-reflective-ceiling-policy"

    def __init__(self, name: str) -> None:
        self.name = name
        self._tick = 0

    @classmethod
    def from_parameters(cls, name: str, params: Section, services: Services) -> SoftReflectiveCeilingPolicy:
        if params.data:
            raise ConfigError(params.path, "soft-reflective-ceiling-policy takes no parameters")
        return cls(name)

    def ceilings(self, saturation: float, priorities: Sequence[int]) -> Sequence[float]:
        n = len(priorities)
        if n <= 1:
            return [1.0] * n
        is_open = False
        if 1.0 - saturation <= saturation < 1.0:
            period = max(1, round(saturation / (1.0 - saturation + 1e-9)))
            self._tick += 1
            is_open = self._tick % period == 0
        out = [1.0]
        for i in range(1, n):
            reflective = 1.0 - i * saturation / (n - 1)
            if saturation < reflective:
                out.append(1.0)
            elif saturation >= 1.0:
                out.append(0.0)
            else:
                out.append(1.0 if is_open else 0.0)
        return out
