"""A request's arrival ends the KV-event thread's batch-window pause: the prompt an engine has
just cached is in the index when the request is decided, not a window later.

Real ZMQ publishers on loopback play four engines; the service runs in process behind a real gRPC
channel. A trickle of decode-step messages makes the ingestion thread gather them a window (1 s)
at a time. Mid-pause, one engine publishes the blocks of a prompt; the request for that prompt
arrives (headers and body, as Envoy sends a small one): its headers end the pause, its decision
waits for the thread's read, and it lands on the engine that holds the prompt.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import pytest
import zmq
from harness import BUFFERED, Client, body, headers, metadata_destination, running_service
from integration.transport.kv_transport_helpers import MODEL, Publisher, free_port, pause_in_flight
from integration.transport.kv_transport_wire import chain

from ppc_extproc.events.transport import ZmqTransport
from ppc_extproc.plugins.producers.precise_prefix_cache import PrecisePrefixCacheProducer

pytestmark = pytest.mark.integration

CONFIG = """apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: precise-prefix-cache-producer
  parameters:
    kvEventsConfig: {{batchWindow: 1s, podDiscoveryConfig: {{socketPort: {port}}}}}
- {{type: prefix-cache-scorer, parameters: {{prefixMatchInfoProducerName: precise-prefix-cache-producer}}}}
- {{type: max-score-picker}}
schedulingProfiles:
- name: default
  plugins: [{{pluginRef: prefix-cache-scorer, weight: 1}}, {{pluginRef: max-score-picker}}]
"""
IPS = ["127.0.6.51", "127.0.6.52", "127.0.6.53", "127.0.6.54"]


@pytest.fixture
def zctx() -> Iterator[zmq.Context[Any]]:
    context: zmq.Context[Any] = zmq.Context()
    yield context
    context.destroy(linger=0)


def test_a_request_is_decided_on_the_blocks_cached_before_it_arrived(tmp_path: Path, zctx: zmq.Context[Any]) -> None:
    port = free_port(IPS[0])
    pubs = [Publisher(zctx, ip, port) for ip in IPS]
    endpoints = ",".join(pub.endpoint_id for pub in pubs)
    try:
        with running_service(tmp_path, CONFIG.format(port=port), endpoints=endpoints) as service:
            producer = service.loaded.plugins["precise-prefix-cache-producer"]
            assert isinstance(producer, PrecisePrefixCacheProducer)
            transport = producer.transport
            assert isinstance(transport, ZmqTransport)
            for pub in pubs:
                pub.wait_subscribed()
            stats = producer.stats

            trickled = 0
            while transport.diagnostics()["pauses"] < 2:  # decode steps, until the thread gathers them
                assert trickled < 500, transport.diagnostics()
                payload, _ = chain(10_000 + trickled, 1, 100_000 + 16 * trickled)
                pubs[trickled % 3].send(payload)  # not the engine that will hold the prompt
                trickled += 1
                time.sleep(0.02)  # traffic pacing, not a wait
            pause_in_flight(transport)
            holder = pubs[3]
            payload, prompt = chain(1, 8, 1)
            holder.send(payload)  # waits in the pause, which has most of its second to run
            pause_in_flight(transport, after=transport.diagnostics()["paused_for"] + 0.1)  # it has arrived
            # A decision waits up to 1 ms for the thread's read; a loaded test machine may need more.
            transport.tuning = replace(transport.tuning, flush_wait_seconds=10.0)
            client = Client(service.grpc_port)
            try:
                replies = client.run([headers(mode=BUFFERED, response_mode=1),
                                      body(orjson.dumps({"model": MODEL, "prompt": prompt, "max_tokens": 1}))])
            finally:
                client.close()
            assert metadata_destination(replies[-1]) == holder.endpoint_id
            diagnostics = transport.diagnostics()
            assert diagnostics["flushes"] == 1, diagnostics
            assert stats.transport.get((holder.endpoint_id, "batches"), 0) == 1
    finally:
        for pub in pubs:
            pub.close()
