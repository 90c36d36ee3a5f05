"""``disagg-profile-handler``: decode, and — when their deciders say so — encode and prefill on
other endpoints (P/D, E/PD, E/P/D disaggregation).

Type        ``disagg-profile-handler`` (profile handler; also a pre-request and response hook)
Behaviour   ``decode-first`` (default): run the decode profile; no pick ⇒ the request fails. Then
            the encode profile when it exists and ``deciders.encode`` approves; then the prefill
            profile when it exists and ``deciders.prefill`` approves the decode pick, which is
            published as ``peer-endpoint`` (topology plugins compare prefill candidates with it).
            ``prefill-first``: run the prefill profile whenever it exists, then encode (as
            above), then decode with the prefill pick as ``peer-endpoint``; a prefill decider is
            an error there. A stage whose filters leave nothing is skipped. Decode is the
            primary profile: its pick is the destination. The prefill pick is health-checked
            (``disagg_stages``); pre-request sets ``x-prefiller-host-port: <ip:port>`` and
            ``x-encoder-hosts-ports: <ip:port>,…`` (and drops inbound values); the decode target
            is credited with the prompt's KV blocks (``SchedulingResult.kv_source``).
Metrics     ``llm_d_epp_disagg_decision_total`` and the deprecated
            ``llm_d_inference_scheduler_disagg_decision_total``, decision ``decode-only``,
            ``prefill-decode``, ``encode-decode`` or ``encode-prefill-decode``;
            ``ppc_extproc_pd_prefill_fallback_total{reason}``, ``ppc_extproc_pd_prefill_repick_total``
Parameters  ``stageOrder`` [``decode-first``; or ``prefill-first``; ``-``/``_`` and case ignored]
            ``profiles.decode`` [decode], ``profiles.prefill`` [prefill], ``profiles.encode`` [encode]
            ``deciders.prefill``, ``deciders.encode``: decider plugin names (unset ⇒ stage off)
            Deprecated flat form (warned; not mixable with the nested one): ``decodeProfile``,
            ``prefillProfile``, ``encodeProfile``, ``prefillDeciderPluginName``,
            ``encodeDeciderPluginName``, ``deciderPluginName`` (→ ``deciders.prefill`` when that is unset)

    plugins:
    - type: prefix-based-pd-decider
      parameters: {nonCachedTokens: 16}
    - type: disagg-profile-handler
      parameters: {deciders: {prefill: prefix-based-pd-decider}}
    schedulingProfiles:
    - {name: prefill, plugins: [{pluginRef: prefill-filter}, {pluginRef: max-score-picker}]}
    - {name: decode, plugins: [{pluginRef: decode-filter}, {pluginRef: max-score-picker}]}

Follows ``llm-d/llm-d-router: pkg/epp/framework/plugins/scheduling/profilehandler/disagg/disagg_profile_handler.go``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ppc_extproc.errors import ConfigError, SchedulingError
from ppc_extproc.framework import (
    DISAGG_PEER,
    Plugin,
    PluginReferences,
    PluginState,
    PreRequest,
    ProfileHandler,
    ProfileResult,
    ResponseComplete,
    ResponseInfo,
    SchedulingContext,
    SchedulingResult,
    StateReporter,
    plays,
)
from ppc_extproc.framework.params import Section
from ppc_extproc.plugins.profile_handlers.deciders import Decider
from ppc_extproc.plugins.profile_handlers.disagg_stages import (
    DecisionCounters,
    decision_type,
    prefill_failed,
    set_disagg_headers,
    settle_prefill,
    stage_state,
)
from ppc_extproc.plugins.registry import Services, register
from ppc_extproc.scheduling.health import EndpointHealth

__all__ = ["DisaggConfig", "DisaggProfileHandler", "parse_stage_order"]

DECODE_FIRST = "decode-first"
PREFILL_FIRST = "prefill-first"
_NESTED = ("stageOrder", "profiles", "deciders")
_LEGACY = ("decodeProfile", "prefillProfile", "encodeProfile", "prefillDeciderPluginName",
           "encodeDeciderPluginName", "deciderPluginName")  # fmt: skip


def parse_stage_order(value: str, path: str) -> str:
    """llm-d's ``ParseStageOrder``: ``decode-first`` (also "", ``decode``) or ``prefill-first``."""
    folded = value.lower().replace("-", "").replace("_", "")
    if folded in ("", "decodefirst", "decode"):
        return DECODE_FIRST
    if folded in ("prefillfirst", "prefill"):
        return PREFILL_FIRST
    raise ConfigError(path, f"invalid stage order {value!r}, must be {DECODE_FIRST!r} or {PREFILL_FIRST!r}")


@dataclass(frozen=True, slots=True)
class DisaggConfig:
    stage_order: str = DECODE_FIRST
    decode_profile: str = "decode"
    prefill_profile: str = "prefill"
    encode_profile: str = "encode"
    prefill_decider: str = ""
    encode_decider: str = ""
    #: Where the decider names sit in the document (errors resolving them point there).
    prefill_path: str = ""
    encode_path: str = ""


def _parse(params: Section) -> DisaggConfig:
    nested = [k for k in _NESTED[1:] if params.has(k)]
    legacy = [k for k in _LEGACY if params.has(k)]
    if nested and legacy:
        raise ConfigError(params.child_path(legacy[0]),
                          f"failed to parse parameters of the disagg-profile-handler: {legacy[0]!r} is the deprecated "
                          f"flat form and {nested[0]!r} the nested one; use one format exclusively")  # fmt: skip
    order = parse_stage_order(params.string("stageOrder", ""), params.child_path("stageOrder"))
    if legacy:
        params.warn("", "Deprecated: using flat parameter format, migrate to nested profiles/deciders format")
        read = {k: params.string(k, "") for k in _LEGACY}
        for old, new in (("decodeProfile", "profiles.decode"), ("prefillProfile", "profiles.prefill"),
                         ("encodeProfile", "profiles.encode"), ("prefillDeciderPluginName", "deciders.prefill"),
                         ("encodeDeciderPluginName", "deciders.encode")):  # fmt: skip
            if read[old]:
                params.warn(old, f"deprecated parameter, use '{new}' instead")
        prefill = read["prefillDeciderPluginName"]
        prefill_key = "prefillDeciderPluginName"
        if read["deciderPluginName"] and not prefill:
            params.warn("deciderPluginName", "deprecated parameter, use 'deciders.prefill' instead")
            prefill, prefill_key = read["deciderPluginName"], "deciderPluginName"
        config = DisaggConfig(order, read["decodeProfile"] or "decode", read["prefillProfile"] or "prefill",
                              read["encodeProfile"] or "encode", prefill, read["encodeDeciderPluginName"],
                              params.child_path(prefill_key), params.child_path("encodeDeciderPluginName"))  # fmt: skip
    else:
        profiles, deciders = params.section("profiles"), params.section("deciders")
        config = DisaggConfig(
            order, profiles.string("decode", "") or "decode", profiles.string("prefill", "") or "prefill",
            profiles.string("encode", "") or "encode", deciders.string("prefill", ""), deciders.string("encode", ""),
            deciders.child_path("prefill"), deciders.child_path("encode"),
        )  # fmt: skip
        profiles.finish()
        deciders.finish()
    if config.stage_order == PREFILL_FIRST and config.prefill_decider:
        raise ConfigError(config.prefill_path, f"prefill decider is not supported in {PREFILL_FIRST} stage order")
    return config


def resolve_decider(plugins: Mapping[str, Plugin], name: str, path: str, stage: str) -> Decider | None:
    """The decider plugin called ``name`` ("" ⇒ none); ``ConfigError`` at ``path`` otherwise."""
    if not name:
        return None
    plugin = plugins.get(name)
    if plugin is None:
        raise ConfigError(path, f"deciders.{stage} plugin not found: {name}")
    if not plays(plugin, Decider):
        raise ConfigError(path, f"plugin {name} does not implement {stage}DeciderPlugin")
    return plugin


@register("disagg-profile-handler")
class DisaggProfileHandler(ProfileHandler, PreRequest, ResponseComplete, PluginReferences, StateReporter):
    multi_profile = True
    #: ``disagg`` here; the deprecated ``pd-profile-handler`` records llm-d's ``pd`` family.
    family = "disagg"

    def __init__(self, name: str = "disagg-profile-handler", config: DisaggConfig | None = None,
                 health: EndpointHealth | None = None) -> None:  # fmt: skip
        self.name = name
        self.config = config or DisaggConfig()
        self.health = health if health is not None else EndpointHealth()
        self.prefill_decider: Decider | None = None
        self.encode_decider: Decider | None = None
        self.counters = DecisionCounters()

    @classmethod
    def from_parameters(cls, name: str, params: Section, services: Services) -> DisaggProfileHandler:
        return cls(name, _parse(params), services.health)

    def resolve_references(self, plugins: Mapping[str, Plugin]) -> None:
        c = self.config
        self.prefill_decider = resolve_decider(plugins, c.prefill_decider, c.prefill_path, "prefill")
        self.encode_decider = resolve_decider(plugins, c.encode_decider, c.encode_path, "encode")

    # --- scheduling ----------------------------------------------------------------------------

    def pick_profiles(
        self, ctx: SchedulingContext, profiles: Sequence[str], results: Mapping[str, ProfileResult]
    ) -> list[str]:
        if self.config.stage_order == PREFILL_FIRST:
            return self._prefill_first(ctx, profiles, results)
        return self._decode_first(ctx, profiles, results)

    def _decode_first(self, ctx: SchedulingContext, profiles: Sequence[str], results: Mapping[str, ProfileResult]) -> list[str]:
        c = self.config
        if c.decode_profile not in results:
            return [self._decode_profile(profiles)]
        decoded = results[c.decode_profile].targets
        if not decoded:
            return []
        state = stage_state(ctx, self.name)
        for stage, decider in ((c.encode_profile, self.encode_decider), (c.prefill_profile, self.prefill_decider)):
            if stage in profiles and stage not in results and stage not in state.skipped:
                if decider is not None and decider.disaggregate(ctx, decoded[0]):
                    if stage == c.prefill_profile:
                        ctx.put(DISAGG_PEER, decoded[0])
                    return [stage]
                state.skipped.add(stage)
        self._record(ctx, results)
        return []

    def _prefill_first(self, ctx: SchedulingContext, profiles: Sequence[str], results: Mapping[str, ProfileResult]) -> list[str]:
        c = self.config
        state = stage_state(ctx, self.name)
        if c.decode_profile in results:
            if results[c.decode_profile].targets:
                self._record(ctx, results)
            return []
        if c.prefill_profile in profiles and c.prefill_profile not in results:
            return [c.prefill_profile]
        if c.encode_profile in profiles and c.encode_profile not in results and c.encode_profile not in state.skipped:
            if self.encode_decider is not None and self.encode_decider.disaggregate(ctx, None):
                return [c.encode_profile]
            state.skipped.add(c.encode_profile)
        prefill = settle_prefill(ctx, results, c.prefill_profile, state, self.health)
        if prefill is not None:
            ctx.put(DISAGG_PEER, prefill)
        return [self._decode_profile(profiles)]

    def _decode_profile(self, profiles: Sequence[str]) -> str:
        if self.config.decode_profile not in profiles:
            raise SchedulingError(f"{self.type_name} {self.name}: no scheduling profile named "
                                  f"{self.config.decode_profile!r} (profiles.decode)")  # fmt: skip
        return self.config.decode_profile

    def _record(self, ctx: SchedulingContext, results: Mapping[str, ProfileResult]) -> None:
        c = self.config
        state = stage_state(ctx, self.name)
        prefill = settle_prefill(ctx, results, c.prefill_profile, state, self.health)
        encode = results.get(c.encode_profile)
        decision = decision_type(encode is not None and bool(encode.targets), prefill is not None)
        if not ctx.dry_run:  # /debug/score decides without routing
            self.counters.record(self.family, ctx.request.model, decision, state)

    def process_results(self, ctx: SchedulingContext, results: Mapping[str, ProfileResult]) -> SchedulingResult:
        c = self.config
        decode = results.get(c.decode_profile)
        if decode is None or not decode.targets:
            return SchedulingResult(c.decode_profile, dict(results), [], [])
        prefill = settle_prefill(ctx, results, c.prefill_profile, stage_state(ctx, self.name), self.health)
        kept = {c.decode_profile: decode}
        for stage in (c.prefill_profile, c.encode_profile):
            ran = results.get(stage)
            if ran is not None and ran.targets:
                kept[stage] = ran
        return SchedulingResult(c.decode_profile, kept, decode.targets, [e.id for e in decode.targets],
                                kv_source=prefill)  # fmt: skip

    # --- hooks ---------------------------------------------------------------------------------

    def pre_request(self, ctx: SchedulingContext, result: SchedulingResult) -> None:
        set_disagg_headers(ctx, result, self.config.prefill_profile, self.config.encode_profile, self.name)

    def response_complete(self, ctx: SchedulingContext, info: ResponseInfo) -> None:
        prefill_failed(ctx, info, self.name, self.health)

    def state(self, *, detailed: bool = False) -> PluginState:
        return PluginState(self.name, self.type_name, decisions=dict(self.counters.counts))
