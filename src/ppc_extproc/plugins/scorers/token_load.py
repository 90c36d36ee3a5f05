"""``token-load-scorer``: prefer endpoints with fewer uncached prompt tokens to prefill.

Type        ``token-load-scorer`` (scorer)
Formula     ``L = inflight_tokens(ep) + own(ep)``; ``L ≤ 0`` ⇒ 1.0; else ``1 − min(L, T) / T``
            ``own(ep) = max(0, prompt_tokens − cachedBlockCount × blockSizeTokens)`` of this request
            on ``ep``; no match info ⇒ the whole prompt
Consumes    ``InFlightLoadDataKey/<inFlightLoadProducerName>`` (uncached tokens this replica has
            in flight per endpoint; the loader adds an ``inflight-load-producer`` when none of that
            name is configured) and ``PrefixCacheMatchInfoDataKey/<producer>``; no engine metrics,
            so nothing goes stale
Parameters  ``queueThresholdTokens`` T (default 4194304 = 128 requests × 32K; ≤ 0 falls back to
            the default with a warning, as llm-d's ``token_load.go`` does)
            ``prefixMatchInfoProducerName`` (ppc-extproc; llm-d sets it on its in-flight-load
            producer): the producer whose match info discounts the request's own tokens. Unset ⇒
            the best cached prefix any producer reports for the endpoint — what the router charges
            to the in-flight tracker — so llm-d configs load without an extra approximate producer
            ``inFlightLoadProducerName`` [inflight-load-producer]; ``nonTextTokenWeight``: accepted
            for llm-d compatibility (in-flight load counts text tokens only)

    plugins:
    - type: precise-prefix-cache-producer
    - type: token-load-scorer
      parameters:
        queueThresholdTokens: 4194304
        prefixMatchInfoProducerName: precise-prefix-cache-producer

``request_token_load(ctx, endpoint_id)`` is the number the router should charge to
``InflightTracker.start(request_id, endpoint, tokens)`` for the primary target.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ppc_extproc.framework import (
    IN_FLIGHT_LOAD,
    PREFIX_CACHE_MATCH_INFO,
    TOKENIZED_PROMPT,
    Consumes,
    DataConsumer,
    DataKey,
    Endpoint,
    SchedulingContext,
    Scorer,
)
from ppc_extproc.framework.params import Section, decode, param
from ppc_extproc.ids import EndpointId
from ppc_extproc.matchinfo import PrefixCacheMatchInfo
from ppc_extproc.plugins.producers.inflight_load import INFLIGHT_LOAD_PRODUCER
from ppc_extproc.plugins.registry import Services, register

__all__ = ["TokenLoadConfig", "TokenLoadScorer", "request_token_load"]

DEFAULT_QUEUE_THRESHOLD_TOKENS = 4_194_304


def request_token_load(
    ctx: SchedulingContext, endpoint_id: str, match_key: DataKey[PrefixCacheMatchInfo] | None = None
) -> int:
    """Uncached prompt tokens this request would add on ``endpoint_id``: the prompt minus the
    cached prefix from ``match_key``'s match info (None: the best any producer reports)."""
    return ctx.uncached_tokens(EndpointId(endpoint_id), match_key)


@dataclass(frozen=True, slots=True)
class TokenLoadConfig:
    """The scorer's parameters (``nonTextTokenWeight`` is accepted, unused)."""

    queue_threshold_tokens: int = param("queueThresholdTokens", DEFAULT_QUEUE_THRESHOLD_TOKENS)
    inflight_producer: str = param("inFlightLoadProducerName", "")
    non_text_token_weight: float = param("nonTextTokenWeight", 1.0)
    producer_name: str = param("prefixMatchInfoProducerName", "")


@register("token-load-scorer")
class TokenLoadScorer(Scorer, DataConsumer):
    def __init__(
        self,
        name: str,
        queue_threshold_tokens: int = DEFAULT_QUEUE_THRESHOLD_TOKENS,
        producer_name: str = "",
        inflight_producer: str = "",
    ) -> None:
        self.name = name
        self.load_key = IN_FLIGHT_LOAD.of(inflight_producer or INFLIGHT_LOAD_PRODUCER)
        self.queue_threshold_tokens = queue_threshold_tokens
        #: "" ⇒ the best cached prefix over all producers' match info (no producer is required).
        self.producer_name = producer_name
        self.match_key = PREFIX_CACHE_MATCH_INFO.of(producer_name) if producer_name else None

    def consumes(self) -> tuple[Consumes[object], ...]:
        # The prompt's token count, optionally: without ids the request's own load counts 0.
        own: tuple[Consumes[object], ...] = (Consumes(IN_FLIGHT_LOAD, self.load_key.producer),
                                             Consumes(TOKENIZED_PROMPT, required=False))  # fmt: skip
        if not self.producer_name:  # the best match info of any producer, when there is one
            return (*own, Consumes(PREFIX_CACHE_MATCH_INFO, required=False))
        return (*own, Consumes(PREFIX_CACHE_MATCH_INFO, self.producer_name))

    @classmethod
    def from_parameters(cls, name: str, params: Section, services: Services) -> TokenLoadScorer:
        config = decode(params, TokenLoadConfig)
        threshold = config.queue_threshold_tokens
        if threshold <= 0:
            params.warn("queueThresholdTokens",
                        f"{threshold} should be positive; using the default {DEFAULT_QUEUE_THRESHOLD_TOKENS} (as llm-d)")
            threshold = DEFAULT_QUEUE_THRESHOLD_TOKENS
        return cls(name, threshold, config.producer_name, config.inflight_producer)

    def score(self, ctx: SchedulingContext, endpoints: Sequence[Endpoint]) -> dict[EndpointId, float]:
        threshold = self.queue_threshold_tokens
        scores: dict[EndpointId, float] = {}
        inflight = ctx.get(self.load_key)
        for endpoint in endpoints:
            load = (inflight.tokens(endpoint.id) if inflight is not None else 0) + ctx.uncached_tokens(
                endpoint.id, self.match_key
            )
            scores[endpoint.id] = 1.0 if load <= 0 else 1.0 - min(load, threshold) / threshold
        return scores
