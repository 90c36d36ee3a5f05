"""Disaggregation deciders: whether a request's prefill (or encode) stage runs on other endpoints.

Types       ``prefix-based-pd-decider``, ``always-disagg-pd-decider``,
            ``always-disagg-multimodal-decider`` (deciders; a ``disagg-profile-handler`` names them
            under ``deciders.prefill`` / ``deciders.encode``)

``prefix-based-pd-decider`` — disaggregate when the decode pick would have to prefill many tokens:

    nonCachedTokens = 0                 ⇒ never (the decider is off)
    prompt < promptTokens (when > 0)    ⇒ no
    prompt < nonCachedTokens            ⇒ no
    prompt − cachedBlockCount × blockSizeTokens ≥ nonCachedTokens  ⇒ yes

``prompt`` is the request's token count (token ids in the body, or a token producer's; llm-d
auto-creates an estimate ``token-producer`` for text). Cached tokens come from the decode pick's
``PrefixCacheMatchInfo`` of ``prefixMatchInfoProducerName`` — unweighted, so CPU-tier hits count
in full. A prompt with no full block has no match info: nothing of it can be cached, so it is
decided on its token count (llm-d skips P/D for it, llm-d/llm-d-router issue #867). Missing match
info for a longer prompt (the producer failed or had no exact token ids) ⇒ no.

Parameters  ``nonCachedTokens`` [0; ≥ 0], ``promptTokens`` [0; ≥ 0],
            ``prefixMatchInfoProducerName`` [""; empty reads ``approx-prefix-cache-producer``, as
            llm-d's default key (PR #2560 added the parameter)]

``always-disagg-pd-decider`` — always yes. ``always-disagg-multimodal-decider`` — yes when the
prompt carries multimodal items (``image_url``, ``video_url``, ``input_audio``, ``audio_url``
content parts, as the token producer records them). Neither has parameters.

    plugins:
    - type: prefix-based-pd-decider
      parameters: {nonCachedTokens: 512, prefixMatchInfoProducerName: precise-prefix-cache-producer}
    - type: disagg-profile-handler
      parameters: {deciders: {prefill: prefix-based-pd-decider}}

Follows ``llm-d/llm-d-router: pkg/epp/framework/plugins/scheduling/profilehandler/disagg/``
(``prefix_based_pd_decider.go``, ``always_disagg_pd_decider.go``, ``always_disagg_mm_decider.go``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import structlog

from ppc_extproc.errors import ConfigError
from ppc_extproc.framework import (
    PREFIX_CACHE_MATCH_INFO,
    TOKENIZED_PROMPT,
    Consumes,
    DataConsumer,
    Endpoint,
    Plugin,
    PluginReferences,
    SchedulingContext,
)
from ppc_extproc.framework.params import Section, decode, param
from ppc_extproc.plugins.registry import Services, register

__all__ = [
    "AlwaysDisaggMultimodalDecider",
    "AlwaysDisaggPDDecider",
    "Decider",
    "PrefixBasedPDDecider",
    "PrefixBasedPDDeciderConfig",
]

log = structlog.get_logger(__name__)

#: The producer read when ``prefixMatchInfoProducerName`` is empty (llm-d's default key).
APPROXIMATE_PRODUCER = "approx-prefix-cache-producer"


class Decider(Plugin, Protocol):
    """Whether the stage it gates runs for this request; ``endpoint`` is the decode pick (None
    when decode has not run yet: prefill-first order)."""

    def disaggregate(self, ctx: SchedulingContext, endpoint: Endpoint | None) -> bool: ...


@dataclass(frozen=True, slots=True)
class PrefixBasedPDDeciderConfig:
    non_cached_tokens: int = param("nonCachedTokens", 0)
    prompt_tokens: int = param("promptTokens", 0)
    producer_name: str = param("prefixMatchInfoProducerName", "")


@register("prefix-based-pd-decider")
class PrefixBasedPDDecider(Decider, DataConsumer, PluginReferences):
    """``prefix-based-pd-decider``: disaggregate when the decode pick's uncached prompt tokens reach
    ``nonCachedTokens`` (the rule is in this module's docstring).

    Type        ``prefix-based-pd-decider`` (decider)
    Parameters  ``nonCachedTokens`` [0 = off], ``promptTokens`` [0 = no gate],
                ``prefixMatchInfoProducerName`` [approx-prefix-cache-producer]

        plugins:
        - type: prefix-based-pd-decider
          parameters: {nonCachedTokens: 512}
    """

    def __init__(self, name: str = "prefix-based-pd-decider", config: PrefixBasedPDDeciderConfig | None = None) -> None:
        self.name = name
        self.config = config or PrefixBasedPDDeciderConfig()
        self.reads = self.config.producer_name or APPROXIMATE_PRODUCER
        self.match_key = PREFIX_CACHE_MATCH_INFO.of(self.reads)
        #: The producer's block size, once resolved: a prompt shorter than it has no match info.
        self.block_size: int | None = None

    @classmethod
    def from_parameters(cls, name: str, params: Section, services: Services) -> PrefixBasedPDDecider:
        config = decode(params, PrefixBasedPDDeciderConfig)
        for key, value in (("nonCachedTokens", config.non_cached_tokens), ("promptTokens", config.prompt_tokens)):
            if value < 0:
                raise ConfigError(params.child_path(key),
                                  f"{key} parameter of prefix disaggregation decider cannot be negative")  # fmt: skip
        if config.non_cached_tokens == 0:
            params.warn("nonCachedTokens", "0: prefix-based P/D is disabled (the decider always says no)")
        return cls(name, config)

    def consumes(self) -> tuple[Consumes[object], ...]:
        return (Consumes(PREFIX_CACHE_MATCH_INFO, self.reads), Consumes(TOKENIZED_PROMPT))

    def resolve_references(self, plugins: Mapping[str, Plugin]) -> None:
        producer = plugins.get(self.reads)
        size = getattr(producer, "block_size", None)
        if callable(size):  # the approximate producer's may be tuned from engine metrics
            size = getattr(producer, "configured_block_size", None)
        self.block_size = size if isinstance(size, int) and size > 0 else None

    def disaggregate(self, ctx: SchedulingContext, endpoint: Endpoint | None) -> bool:
        threshold = self.config.non_cached_tokens
        if threshold == 0 or endpoint is None:
            return False
        prompt = ctx.prompt_tokens
        if self.config.prompt_tokens > 0 and prompt < self.config.prompt_tokens:
            return False
        if prompt < threshold:
            return False
        info = ctx.endpoint_value(endpoint.id, self.match_key)
        if info is None:
            if self.block_size is None or prompt >= self.block_size:
                log.debug("pd_decider_no_match_info", decider=self.name, request_id=ctx.request.request_id)
                return False
            cached = 0  # shorter than one block: nothing of it can be cached anywhere
        else:
            cached = info.cached_block_count * info.block_size_tokens
        return prompt - cached >= threshold


@register("always-disagg-pd-decider")
class AlwaysDisaggPDDecider(Decider):
    """``always-disagg-pd-decider``: every request runs its prefill stage on a prefill endpoint.

    Type        ``always-disagg-pd-decider`` (decider)
    Parameters  none

        plugins:
        - type: always-disagg-pd-decider
    """

    def __init__(self, name: str = "always-disagg-pd-decider") -> None:
        self.name = name

    @classmethod
    def from_parameters(cls, name: str, params: Section, services: Services) -> AlwaysDisaggPDDecider:
        return cls(name)

    def disaggregate(self, ctx: SchedulingContext, endpoint: Endpoint | None) -> bool:
        return True


@register("always-disagg-multimodal-decider")
class AlwaysDisaggMultimodalDecider(Decider, DataConsumer):
    """``always-disagg-multimodal-decider``: run the encode stage for requests carrying images,
    video or audio (the items the token producer found).

    Type        ``always-disagg-multimodal-decider`` (decider)
    Parameters  none

        plugins:
        - type: always-disagg-multimodal-decider
    """

    def __init__(self, name: str = "always-disagg-multimodal-decider") -> None:
        self.name = name

    @classmethod
    def from_parameters(cls, name: str, params: Section, services: Services) -> AlwaysDisaggMultimodalDecider:
        return cls(name)

    def consumes(self) -> tuple[Consumes[object], ...]:
        return (Consumes(TOKENIZED_PROMPT),)  # the token producer records the multimodal items

    def disaggregate(self, ctx: SchedulingContext, endpoint: Endpoint | None) -> bool:
        tokenized = ctx.request.tokenized
        return tokenized is not None and bool(tokenized.features)
