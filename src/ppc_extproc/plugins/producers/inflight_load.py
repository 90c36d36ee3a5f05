"""``inflight-load-producer``: the in-flight load per endpoint, under a data key.

Type        ``inflight-load-producer`` (producer)
Produces    ``InFlightLoadDataKey/<name>``: an ``InFlightLoad`` view (``requests(endpoint)``,
            ``tokens(endpoint)``) of the requests this replica routed and has not seen finish, read
            with ``in_flight_load(ctx, name)``. One reference per request, no per-endpoint work:
            llm-d likewise puts a dynamic attribute on the endpoint that reads its counters live
            (``llm-d/llm-d-router: pkg/epp/framework/plugins/requestcontrol/dataproducer/inflightload/``).
Accounting  done by the router for every request: the primary target's uncached prompt tokens count
            from routing to the response's first byte (the prefill is done), the request from
            routing to the end of its response.
Consumes    ``TokenizedPrompt`` (the prompt tokens counted); match info of
            ``prefixMatchInfoProducerName`` [approx-prefix-cache-producer] optionally (the cached
            prefix is not counted; the router charges the best prefix any producer reports)
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

from typing import Protocol

from ppc_extproc.framework import DataProducer, SchedulingContext
from ppc_extproc.framework.datakeys import PREFIX_CACHE_MATCH_INFO, TOKENIZED_PROMPT, Consumes, DataKey
from ppc_extproc.framework.params import Section
from ppc_extproc.ids import EndpointId
from ppc_extproc.plugins.registry import Services, register

__all__ = ["IN_FLIGHT_LOAD", "InFlightLoad", "InflightLoadProducer", "in_flight_load"]

#: The data type llm-d names ``InFlightLoadDataKey`` (``datalayer/attribute/concurrency``).
IN_FLIGHT_LOAD = "InFlightLoadDataKey"
TYPE_NAME = "inflight-load-producer"
_DEFAULT_MATCH_INFO_PRODUCER = "approx-prefix-cache-producer"


class InFlightLoad(Protocol):
    """Live in-flight counts per endpoint (``InflightTracker`` is one)."""

    def requests(self, endpoint: EndpointId) -> int: ...

    def tokens(self, endpoint: EndpointId) -> int: ...


def in_flight_load(ctx: SchedulingContext, producer: str = TYPE_NAME) -> InFlightLoad | None:
    """The view ``producer`` wrote for this request, or None when it did not run."""
    view: InFlightLoad | None = ctx.plugin_data.get(str(DataKey(IN_FLIGHT_LOAD, producer)))
    return view


@register(TYPE_NAME)
class InflightLoadProducer(DataProducer):
    """Writes ``InFlightLoadDataKey/<name>``: a view of the service's in-flight accounting."""

    def __init__(self, name: str, load: InFlightLoad, match_info_producer: str = "") -> None:
        self.name = name
        self.load = load
        self.match_info_producer = match_info_producer or _DEFAULT_MATCH_INFO_PRODUCER
        self._key = str(DataKey(IN_FLIGHT_LOAD, name))

    @classmethod
    def from_parameters(cls, name: str, params: Section, services: Services) -> InflightLoadProducer:
        params.number("outputRatio", 1.5, minimum=0.0)
        if params.has("maxEstimatedOutputTokens"):
            params.integer("maxEstimatedOutputTokens", 0, minimum=0)
        if params.boolean("addEstimatedOutputTokens", False):
            params.warn("addEstimatedOutputTokens", "output tokens are not estimated by ppc-extproc: "
                        "in-flight tokens are the uncached prompt tokens only")
        params.boolean("syncCrossReplicaState", True)  # in-flight load is local to this replica
        return cls(name, services.inflight, params.string("prefixMatchInfoProducerName", ""))

    def produces(self) -> frozenset[DataKey]:
        return frozenset({DataKey(IN_FLIGHT_LOAD, self.name)})

    def consumes(self) -> tuple[Consumes, ...]:
        return (
            Consumes(TOKENIZED_PROMPT),
            Consumes(PREFIX_CACHE_MATCH_INFO, self.match_info_producer, required=False),
        )

    def produce(self, ctx: SchedulingContext) -> None:
        ctx.plugin_data[self._key] = self.load
