"""Endpoint removal ends in one place (``EventApplier.remove_endpoint``), whichever part notices it:
the producer before its transport starts (the null transport) and after it stops."""

from __future__ import annotations

import asyncio

from ppc_extproc.config.epp import load_config_text
from ppc_extproc.events.null_transport import NullTransport
from ppc_extproc.framework import Endpoint, EndpointEvent, EndpointEventKind
from ppc_extproc.index import PodEntry
from ppc_extproc.plugins.producers.precise_prefix_cache import PrecisePrefixCacheProducer
from ppc_extproc.tokens import TokenizedPrompt
from ppc_extproc.tokens.le32 import tokens_to_le32

CONFIG = """apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: precise-prefix-cache-producer
  parameters: {kvEventsConfig: {discoverPods: false}}
- type: prefix-cache-scorer
  parameters: {prefixMatchInfoProducerName: precise-prefix-cache-producer}
"""
A = Endpoint("10.4.0.1", 8000)
B = Endpoint("10.4.0.2", 8000)


def _producer() -> PrecisePrefixCacheProducer:
    (producer,) = load_config_text(CONFIG).roles.producers
    assert isinstance(producer, PrecisePrefixCacheProducer)
    return producer


def _seed(producer: PrecisePrefixCacheProducer) -> None:
    keys = producer.block_keys(TokenizedPrompt("m", (tokens_to_le32(list(range(64))),)))[0]
    producer.index.add(None, keys, [PodEntry(A.id, "gpu"), PodEntry(B.id, "gpu")])
    producer.stats.source(A.id)


def test_a_deleted_endpoint_is_cleared_before_the_transport_starts_and_after_it_stops() -> None:
    producer = _producer()
    assert isinstance(producer.transport, NullTransport)
    _seed(producer)
    producer.extract(EndpointEvent(EndpointEventKind.DELETED, A))
    per_endpoint = producer.index.entries_per_endpoint()
    assert A.id not in per_endpoint and per_endpoint[B.id] == 4
    assert A.id not in producer.stats.sources  # its live KV-event state went too

    asyncio.run(producer.start())
    asyncio.run(producer.stop())
    assert isinstance(producer.transport, NullTransport)
    producer.extract(EndpointEvent(EndpointEventKind.DELETED, B))
    assert producer.index.entries_per_endpoint() == {}
