"""``inflight-load-producer``: the in-flight load per endpoint, under a data key.

Type        ``inflight-load-producer`` (producer)
Produces    ``InFlightLoadDataKey/<name>``: an ``InFlightLoad`` view (``requests(endpoint)``,
            ``tokens(endpoint)``) of the requests this replica routed and has not seen finish, read
            with ``ctx.get(IN_FLIGHT_LOAD.of(name))``; the same view outside a request is
            ``load`` (a polling source that declares the key is built with it). The loader adds
            one when a consumer needs the key and no producer of that name is configured. One reference per request, no per-endpoint work:
            llm-d likewise puts a dynamic attribute on the endpoint that reads its counters live
            (``llm-d/llm-d-router: pkg/epp/framework/plugins/requestcontrol/dataproducer/inflightload/``).
Accounting  done by the router for every request: the primary target's uncached prompt tokens count
            from routing to the response's first byte (the prefill is done), the request from
            routing to the end of its response.
Consumes    ``TokenizedPrompt``, optionally (it runs after the token producer, as llm-d's does);
            the router counts the prompt tokens and charges the best cached prefix any producer
            reports (``prefixMatchInfoProducerName`` is accepted, unused)
Parameters  ``addEstimatedOutputTokens`` [false], ``outputRatio`` [1.5; ≥ 0],
            ``maxEstimatedOutputTokens`` [unset; ≥ 0], ``prefixMatchInfoProducerName`` [""],
            ``syncCrossReplicaState`` [true]. Output tokens are not estimated here:
            ``addEstimatedOutputTokens: true`` loads with a warning and counts prompt tokens only;
            in-flight load is always local to this replica.

    plugins:
    - type: inflight-load-producer
      parameters: {prefixMatchInfoProducerName: precise-prefix-cache-producer}
"""

from __future__ import annotations

from dataclasses import dataclass

from ppc_extproc.framework import IN_FLIGHT_LOAD, DataProducer, InFlightLoad, SchedulingContext
from ppc_extproc.framework.datakeys import TOKENIZED_PROMPT, Consumes, DataKey
from ppc_extproc.framework.params import Section, decode, param
from ppc_extproc.plugins.registry import Services, register

__all__ = ["INFLIGHT_LOAD_PRODUCER", "InflightLoadConfig", "InflightLoadProducer", "in_flight_load"]

INFLIGHT_LOAD_PRODUCER = TYPE_NAME = "inflight-load-producer"
_DEFAULT_MATCH_INFO_PRODUCER = "approx-prefix-cache-producer"


def in_flight_load(ctx: SchedulingContext, producer: str = TYPE_NAME) -> InFlightLoad | None:
    """The view ``producer`` wrote for this request, or None when it did not run."""
    return ctx.get(IN_FLIGHT_LOAD.of(producer))


@dataclass(frozen=True, slots=True)
class InflightLoadConfig:
    """The producer's parameters; llm-d's output estimate and cross-replica sync are accepted and
    unused (in-flight load here is the uncached prompt tokens, local to this replica)."""

    output_ratio: float = param("outputRatio", 1.5, minimum=0.0)
    max_estimated_output_tokens: int = param("maxEstimatedOutputTokens", 0, minimum=0)
    add_estimated_output_tokens: bool = param("addEstimatedOutputTokens", False)
    sync_cross_replica_state: bool = param("syncCrossReplicaState", True)
    producer_name: str = param("prefixMatchInfoProducerName", "")


@register(TYPE_NAME)
class InflightLoadProducer(DataProducer):
    """Writes ``InFlightLoadDataKey/<name>``: a view of the service's in-flight accounting."""

    def __init__(self, name: str, load: InFlightLoad, match_info_producer: str = "") -> None:
        self.name = name
        self.load = load
        self.match_info_producer = match_info_producer or _DEFAULT_MATCH_INFO_PRODUCER
        self.key = IN_FLIGHT_LOAD.of(name)

    @classmethod
    def from_parameters(cls, name: str, params: Section, services: Services) -> InflightLoadProducer:
        config = decode(params, InflightLoadConfig)
        if config.add_estimated_output_tokens:
            params.warn("addEstimatedOutputTokens", "output tokens are not estimated by ppc-extproc: "
                        "in-flight tokens are the uncached prompt tokens only")
        return cls(name, services.inflight, config.producer_name)

    def produces(self) -> frozenset[DataKey[object]]:
        return frozenset({IN_FLIGHT_LOAD.of(self.name)})

    def consumes(self) -> tuple[Consumes[object], ...]:
        """Token ids, optionally: declared so that it runs after their producer, as llm-d's does;
        the view itself is the same for every request (the router does the counting)."""
        return (Consumes(TOKENIZED_PROMPT, required=False),)

    def produce(self, ctx: SchedulingContext) -> None:
        ctx.put(self.key, self.load)
