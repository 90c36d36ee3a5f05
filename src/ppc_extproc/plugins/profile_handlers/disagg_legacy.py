"""The deprecated P/D plugins llm-d still loads: ``pd-profile-handler``, ``disagg-headers-handler``
and its alias ``prefill-header-handler``.

``pd-profile-handler`` (profile handler, deprecated since llm-d v0.7): run the decode profile;
when the decider approves its pick, run the prefill profile; decode is primary. It sets no
``x-prefiller-host-port`` itself — pair it with ``disagg-headers-handler``. Records llm-d's
``llm_d_epp_pd_decision_total`` (and deprecated ``llm_d_inference_scheduler_pd_decision_total``),
decision ``decode-only`` or ``prefill-decode``.
Parameters  ``decodeProfile`` [decode], ``prefillProfile`` [prefill],
            ``deciderPluginName`` [prefix-based-pd-decider; required to name a decider],
            ``primaryPort`` [0 = off; 1–65535: destinations are rewritten to ``<ip>:primaryPort``
            and the pick goes into ``x-data-parallel-host-port``, deprecated],
            ``prefixPluginType``, ``prefixPluginName`` (never used by llm-d; accepted),
            ``prefixMatchInfoProducerName`` (accepted; the decider reads its own)

``disagg-headers-handler`` / ``prefill-header-handler`` (pre-request, deprecated since v0.9):
``x-prefiller-host-port`` from the prefill profile's pick and ``x-encoder-hosts-ports`` from the
encode profile's picks. Parameters ``prefillProfile`` [prefill], ``encodeProfile`` [encode].

    plugins:
    - type: prefix-based-pd-decider
      parameters: {nonCachedTokens: 256}
    - type: pd-profile-handler
      parameters: {deciderPluginName: prefix-based-pd-decider}
    - type: disagg-headers-handler

Follows ``llm-d/llm-d-router: pkg/epp/framework/plugins/scheduling/profilehandler/disagg/``
(``pd_profile_handler.go``, ``disagg_headers_handler.go``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ppc_extproc.errors import ConfigError
from ppc_extproc.framework import (
    Plugin,
    PreRequest,
    ProfileResult,
    ResponseComplete,
    ResponseInfo,
    SchedulingContext,
    SchedulingResult,
)
from ppc_extproc.framework.params import Section, decode, param
from ppc_extproc.ids import destination_host_port, endpoint_id
from ppc_extproc.plugins.profile_handlers.data_parallel import DATA_PARALLEL_HEADER
from ppc_extproc.plugins.profile_handlers.disagg import DisaggConfig, DisaggProfileHandler, resolve_decider
from ppc_extproc.plugins.profile_handlers.disagg_stages import prefill_failed, set_disagg_headers
from ppc_extproc.plugins.registry import Services, register
from ppc_extproc.scheduling.health import EndpointHealth

__all__ = ["DisaggHeadersHandler", "PdProfileHandler", "PrefillHeaderHandler"]


@dataclass(frozen=True, slots=True)
class PdProfileHandlerConfig:
    decode_profile: str = param("decodeProfile", "decode")
    prefill_profile: str = param("prefillProfile", "prefill")
    prefix_plugin_type: str = param("prefixPluginType", "")
    prefix_plugin_name: str = param("prefixPluginName", "")
    primary_port: int = param("primaryPort", 0)
    decider: str = param("deciderPluginName", "prefix-based-pd-decider")
    producer_name: str = param("prefixMatchInfoProducerName", "")


@register("pd-profile-handler")
class PdProfileHandler(DisaggProfileHandler):
    """``pd-profile-handler``: deprecated P/D handler (decode, then prefill when the decider says so).

    Type        ``pd-profile-handler`` (profile handler); details in this module's docstring
    Parameters  ``decodeProfile``, ``prefillProfile``, ``deciderPluginName``, ``primaryPort``, …

        plugins:
        - type: pd-profile-handler
          parameters: {deciderPluginName: prefix-based-pd-decider}
    """

    family = "pd"

    def __init__(self, name: str, config: DisaggConfig, health: EndpointHealth | None = None,
                 primary_port: int = 0) -> None:  # fmt: skip
        super().__init__(name, config, health)
        self.primary_port = primary_port

    @classmethod
    def from_parameters(cls, name: str, params: Section, services: Services) -> PdProfileHandler:
        params.warn("", "Deprecated: pd-profile-handler is deprecated, use disagg-profile-handler instead")
        c = decode(params, PdProfileHandlerConfig)
        if c.primary_port != 0:
            params.warn("primaryPort", "Deprecated: primaryPort not needed with Istio >= 1.28.1")
            if not 1 <= c.primary_port <= 65535:
                raise ConfigError(params.child_path("primaryPort"),
                                  f"invalid primaryPort: must be between 1 and 65535, got {c.primary_port}")  # fmt: skip
        if not c.decider:
            raise ConfigError(params.child_path("deciderPluginName"), "decider plugin name is not defined")
        config = DisaggConfig(decode_profile=c.decode_profile or "decode", prefill_profile=c.prefill_profile or "prefill",
                              prefill_decider=c.decider, prefill_path=params.child_path("deciderPluginName"))  # fmt: skip
        return cls(name, config, services.health, c.primary_port)

    def resolve_references(self, plugins: Mapping[str, Plugin]) -> None:
        try:
            self.prefill_decider = resolve_decider(plugins, self.config.prefill_decider, self.config.prefill_path,
                                                   "prefill")  # fmt: skip
        except ConfigError as exc:
            raise ConfigError(exc.path, f"invalid decider plugin type: {self.config.prefill_decider}") from None

    def process_results(self, ctx: SchedulingContext, results: Mapping[str, ProfileResult]) -> SchedulingResult:
        result = super().process_results(ctx, results)
        port = self.primary_port
        if port and result.targets:
            result.destinations = [endpoint_id(e.address, port) for e in result.targets]
            result.add_header(DATA_PARALLEL_HEADER, destination_host_port(result.targets[0].id))
        return result

    def pre_request(self, ctx: SchedulingContext, result: SchedulingResult) -> None:
        """No headers: llm-d's pd-profile-handler leaves them to ``disagg-headers-handler``."""


@dataclass(frozen=True, slots=True)
class HeadersConfig:
    prefill_profile: str = param("prefillProfile", "prefill")
    encode_profile: str = param("encodeProfile", "encode")


@register("disagg-headers-handler")
class DisaggHeadersHandler(PreRequest, ResponseComplete):
    """``disagg-headers-handler``: deprecated pre-request hook that sets ``x-prefiller-host-port`` and
    ``x-encoder-hosts-ports`` from the prefill and encode profiles' picks.

    Type        ``disagg-headers-handler`` (pre-request)
    Parameters  ``prefillProfile`` [prefill], ``encodeProfile`` [encode]

        plugins:
        - type: disagg-headers-handler
    """

    def __init__(self, name: str, config: HeadersConfig | None = None, health: EndpointHealth | None = None) -> None:
        self.name = name
        self.config = config or HeadersConfig()
        self.health = health if health is not None else EndpointHealth()

    @classmethod
    def from_parameters(cls, name: str, params: Section, services: Services) -> DisaggHeadersHandler:
        params.warn("", f"Deprecated: {cls.type_name} is deprecated, use disagg-profile-handler instead "
                        "(it sets these headers itself)")  # fmt: skip
        c = decode(params, HeadersConfig)
        return cls(name, HeadersConfig(c.prefill_profile or "prefill", c.encode_profile or "encode"), services.health)

    def pre_request(self, ctx: SchedulingContext, result: SchedulingResult) -> None:
        set_disagg_headers(ctx, result, self.config.prefill_profile, self.config.encode_profile, self.name)

    def response_complete(self, ctx: SchedulingContext, info: ResponseInfo) -> None:
        prefill_failed(ctx, info, self.name, self.health)


@register("prefill-header-handler")
class PrefillHeaderHandler(DisaggHeadersHandler):
    """``prefill-header-handler``: deprecated alias of ``disagg-headers-handler``.

    Type        ``prefill-header-handler`` (pre-request)
    Parameters  ``prefillProfile`` [prefill], ``encodeProfile`` [encode]

        plugins:
        - type: prefill-header-handler
    """
