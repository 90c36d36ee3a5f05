"""The ``flowControl`` section, as llm-d decodes it (``llm-d/llm-d-router:
apix/config/v1alpha1/endpointpickerconfig_types.go`` ``FlowControlConfig``, defaults from
``pkg/epp/flowcontrol/registry/config.go`` and ``controller/config.go``)::

    featureGates: [flowControl]
    flowControl:
      maxBytes: 10Gi              # global, unset/0: unlimited (Kubernetes quantities)
      maxRequests: 10k            # global, unset/0: unlimited
      defaultRequestTTL: 60s      # queue-wait budget while the pool has endpoints (expiry: 429)
      noEndpointRequestTTL: 60s   # ... while it has none (expiry: 503); follows defaultRequestTTL
      defaultPriorityBand: {maxBytes: 1G, maxRequests: 5000, fairnessPolicyRef, orderingPolicyRef}
      defaultNegativePriorityBand: {...}   # priorities < 0; falls back to defaultPriorityBand
      priorityBands: [{priority: 0, ...}]
      usageLimitPolicyPluginRef: static-usage-limit-policy
      saturationDetector: {pluginRef: utilization-detector}
      enableEviction: false       # accepted; in-flight eviction is not implemented
      # ppc-extproc's additions:
      inflightCredit: true        # count requests dispatched since each endpoint's last scrape
      bandStarvationLimit: 20     # a non-empty band waits at most this many dispatches (0: strict)

Every error names the field's path.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ppc_extproc.errors import ConfigError
from ppc_extproc.framework.params import Section

__all__ = [
    "DEFAULT_BAND_MAX_BYTES",
    "DEFAULT_BAND_MAX_REQUESTS",
    "BandSpec",
    "FlowControlSpec",
    "parse_flow_control",
    "parse_quantity",
]

DEFAULT_BAND_MAX_BYTES = 1_000_000_000  # registry/config.go: 1G
DEFAULT_BAND_MAX_REQUESTS = 5000
DEFAULT_TTL_SECONDS = 60.0
DEFAULT_STARVATION_LIMIT = 20

_QUANTITY = re.compile(r"^\s*([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)\s*(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E)?\s*$")
_SUFFIX = {None: 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
           "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}


def parse_quantity(value: object, path: str) -> int:
    """A Kubernetes resource quantity (``5000``, ``"1k"``, ``"1Gi"``) as an integer, rounded up
    as ``Quantity.Value()`` does; negative ⇒ error naming the field."""
    if isinstance(value, bool):
        raise ConfigError(path, "expected a quantity such as 5000, \"1k\" or \"1Gi\"")
    if isinstance(value, (int, float)):
        number = float(value)
    elif isinstance(value, str) and (match := _QUANTITY.match(value)):
        number = float(match.group(1)) * _SUFFIX[match.group(2)]
    else:
        raise ConfigError(path, f"expected a quantity such as 5000, \"1k\" or \"1Gi\", got {value!r}")
    if number < 0:
        raise ConfigError(path, f"must be non-negative, got {value!r}")
    whole = int(number)
    return whole + 1 if number > whole else whole


@dataclass(frozen=True, slots=True)
class BandSpec:
    """One priority band's limits and policy references ('' = the defaults)."""

    priority: int = 0
    max_bytes: int = DEFAULT_BAND_MAX_BYTES
    max_requests: int = DEFAULT_BAND_MAX_REQUESTS
    fairness_ref: str = ""
    ordering_ref: str = ""
    #: ``(path, field)`` prefix for errors about its references.
    path: str = ""


@dataclass(frozen=True, slots=True)
class FlowControlSpec:
    """The decoded section (references are resolved by the loader)."""

    max_bytes: int = 0
    max_requests: int = 0
    default_ttl: float = DEFAULT_TTL_SECONDS
    no_endpoint_ttl: float = DEFAULT_TTL_SECONDS
    default_band: BandSpec | None = None
    default_negative_band: BandSpec | None = None
    bands: tuple[BandSpec, ...] = ()
    usage_limit_ref: str = ""
    usage_limit_path: str = "flowControl.usageLimitPolicyPluginRef"
    enable_eviction: bool = False
    inflight_credit: bool = True
    band_starvation_limit: int = DEFAULT_STARVATION_LIMIT

    def band_for(self, priority: int) -> BandSpec:
        """The band configuration of ``priority``: its own, else the (negative) default template."""
        for band in self.bands:
            if band.priority == priority:
                return band
        template = (self.default_negative_band if priority < 0 else None) or self.default_band or BandSpec()
        return BandSpec(priority, template.max_bytes, template.max_requests, template.fairness_ref,
                        template.ordering_ref, template.path)  # fmt: skip

    def band_paths(self) -> list[BandSpec]:
        """Every configured band and template, for resolving references."""
        return [b for b in (self.default_band, self.default_negative_band, *self.bands) if b is not None]


def _band(section: Section, *, with_priority: bool) -> BandSpec:
    priority = 0
    if with_priority:
        if not section.has("priority"):
            raise ConfigError(section.child_path("priority"), "a priority band needs a priority")
        priority = section.integer("priority", 0)
    max_bytes = parse_quantity(section.raw("maxBytes", 0), section.child_path("maxBytes"))
    max_requests = parse_quantity(section.raw("maxRequests", 0), section.child_path("maxRequests"))
    band = BandSpec(
        priority,
        max_bytes or DEFAULT_BAND_MAX_BYTES,  # "0" is unset: the system default, not zero capacity
        max_requests or DEFAULT_BAND_MAX_REQUESTS,
        section.string("fairnessPolicyRef", ""),
        section.string("orderingPolicyRef", ""),
        section.path,
    )
    section.finish()
    return band


def parse_flow_control(section: Section) -> FlowControlSpec:
    """Decode ``flowControl`` (``saturationDetector`` is read by the document loader)."""
    section.raw("saturationDetector")
    max_bytes = parse_quantity(section.raw("maxBytes", 0), section.child_path("maxBytes"))
    max_requests = parse_quantity(section.raw("maxRequests", 0), section.child_path("maxRequests"))
    default_ttl = section.duration("defaultRequestTTL", "60s")
    if default_ttl < 0:
        raise ConfigError(section.child_path("defaultRequestTTL"), "must be non-negative")
    # Unset: follows defaultRequestTTL (controller/config.go), so one budget covers both regimes.
    no_endpoint_ttl = section.duration("noEndpointRequestTTL", "60s") if section.has(
        "noEndpointRequestTTL") else default_ttl  # fmt: skip
    if no_endpoint_ttl < 0:
        raise ConfigError(section.child_path("noEndpointRequestTTL"), "must be non-negative")
    default_band = _band(section.section("defaultPriorityBand"), with_priority=False) if section.has(
        "defaultPriorityBand") else None  # fmt: skip
    negative = _band(section.section("defaultNegativePriorityBand"), with_priority=False) if section.has(
        "defaultNegativePriorityBand") else None  # fmt: skip
    bands: list[BandSpec] = []
    seen: set[int] = set()
    for path, item in section.items("priorityBands"):
        band = _band(section.sub(item, path), with_priority=True)
        if band.priority in seen:
            raise ConfigError(f"{path}.priority", f"duplicate priority band {band.priority}")
        seen.add(band.priority)
        bands.append(band)
    eviction = section.boolean("enableEviction", False)
    if eviction:
        section.warn("enableEviction", "in-flight eviction is not implemented by ppc-extproc (accepted and ignored)")
    spec = FlowControlSpec(
        max_bytes=max_bytes,
        max_requests=max_requests,
        default_ttl=default_ttl,
        no_endpoint_ttl=no_endpoint_ttl,
        default_band=default_band,
        default_negative_band=negative,
        bands=tuple(bands),
        usage_limit_ref=section.string("usageLimitPolicyPluginRef", ""),
        usage_limit_path=section.child_path("usageLimitPolicyPluginRef"),
        enable_eviction=eviction,
        inflight_credit=section.boolean("inflightCredit", True),
        band_starvation_limit=section.integer("bandStarvationLimit", DEFAULT_STARVATION_LIMIT, minimum=0),
    )
    section.finish()
    return spec
