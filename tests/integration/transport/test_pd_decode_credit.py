"""P/D over real KV events: the decode engine is credited with the prompt it received.

Real ZMQ publishers on loopback play a prefill engine (BlockStored for the prompt) and a decode
engine (no BlockStored for the transferred blocks; its first generated block names the last
transferred block as parent), against a P/D configuration whose precise producer subscribes to
them. The decode engine's generated block is accepted, not dropped as ``unknown_parent``, and the
conversation's next turn scores as cached on that decode engine and stays decode-only there.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest
import zmq
from kv_transport_helpers import Publisher, free_port, wait_until

from ppc_extproc.config.epp import LoadedConfig, load_config_text
from ppc_extproc.framework import LLMRequest
from ppc_extproc.ids import EndpointId
from ppc_extproc.index.entries import PodEntry
from ppc_extproc.plugins.filters.role import ROLE_LABEL
from ppc_extproc.plugins.producers.precise_prefix_cache import PrecisePrefixCacheProducer
from ppc_extproc.plugins.profile_handlers.disagg_stages import PREFILL_HEADER
from ppc_extproc.scheduling.pool import EndpointPool
from ppc_extproc.scheduling.router import Decision, Router
from ppc_extproc.tokens import TokenizedPrompt
from ppc_extproc.tokens.le32 import tokens_to_le32

MODEL = "my-model"
BLOCK = 16
CONFIG = """apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: precise-prefix-cache-producer
  parameters:
    tokenProcessorConfig: {{blockSizeTokens: 16}}
    kvEventsConfig: {{podDiscoveryConfig: {{socketPort: {port}}}}}
    {extra}
- {{type: prefix-cache-scorer, parameters: {{prefixMatchInfoProducerName: precise-prefix-cache-producer}}}}
- {{type: prefill-filter}}
- {{type: decode-filter}}
- {{type: max-score-picker}}
- type: prefix-based-pd-decider
  parameters: {{nonCachedTokens: 32, prefixMatchInfoProducerName: precise-prefix-cache-producer}}
- {{type: disagg-profile-handler, parameters: {{deciders: {{prefill: prefix-based-pd-decider}}}}}}
schedulingProfiles:
- name: prefill
  plugins: [{{pluginRef: prefill-filter}}, {{pluginRef: max-score-picker}}, {{pluginRef: prefix-cache-scorer, weight: 2}}]
- name: decode
  plugins: [{{pluginRef: decode-filter}}, {{pluginRef: max-score-picker}}, {{pluginRef: prefix-cache-scorer, weight: 2}}]
"""
IPS = {"decode-a": "127.0.6.1", "decode-b": "127.0.6.2", "prefill-a": "127.0.6.11", "prefill-b": "127.0.6.12"}


def stored(hashes: list[int], parent: int | None, tokens: list[int]) -> bytes:
    """A vLLM array-era batch with one BlockStored (GPU)."""
    event: list[Any] = ["BlockStored", hashes, parent, tokens, BLOCK, None, "GPU"]
    return bytes(msgpack.packb([time.time(), [event], 0]))


class Lab:
    def __init__(self, context: zmq.Context[Any], extra: str = "") -> None:
        """``extra``: more producer parameters (one YAML line)."""
        port = free_port(IPS["decode-a"])
        self.publishers = {name: Publisher(context, ip, port, topic=f"kv@{ip}:8000@{MODEL}".encode())
                           for name, ip in IPS.items()}  # fmt: skip
        self.loaded: LoadedConfig = load_config_text(CONFIG.format(port=port, extra=extra))
        producer = self.loaded.plugins["precise-prefix-cache-producer"]
        assert isinstance(producer, PrecisePrefixCacheProducer)
        self.producer = producer
        self.endpoints = {name: pub.endpoint for name, pub in self.publishers.items()}
        self.endpoints = {
            name: type(e)(e.address, e.port, name=name, labels=((ROLE_LABEL, name.split("-")[0]),))
            for name, e in self.endpoints.items()
        }
        producer.start_transport()
        pool = EndpointPool()
        pool.subscribe(self.loaded.services.health.on_endpoint_event)
        pool.subscribe(self.loaded.data_layer.notify)
        pool.replace(self.endpoints.values())
        self.router = Router(pool, self.loaded.pipeline, self.loaded.services.inflight, self.loaded.services.health)
        for pub in self.publishers.values():
            pub.wait_subscribed()

    def close(self) -> None:
        self.producer.stop_transport(5.0)
        for pub in self.publishers.values():
            pub.close()

    def route(self, tokens: list[int], request_id: str) -> Decision:
        prompt = TokenizedPrompt(MODEL, (tokens_to_le32(tokens),))
        return asyncio.run(self.router.route(LLMRequest(request_id, MODEL, prompt)))

    def name_of(self, endpoint_id: str) -> str:
        return next(n for n, e in self.endpoints.items() if e.id == endpoint_id)

    def confirmed_blocks(self, name: str, tokens: list[int]) -> int:
        """Leading blocks of ``tokens`` the index holds for ``name`` as KV-event (GPU) entries."""
        endpoint = EndpointId(self.endpoints[name].id)
        keys = self.producer.processor.keys(tokens_to_le32(tokens), MODEL)
        gpu = PodEntry(endpoint, "gpu").tier_label
        held = 0
        for run in self.producer.index.prefix_runs(keys, [endpoint]):
            if (endpoint, gpu) not in run.info.tiers:
                break
            held += run.count
        return held

    def counter(self, name: str, counter: str) -> int:
        stats = self.producer.stats
        endpoint = self.endpoints[name].id
        return stats.transport.get((endpoint, counter), 0) + stats.dropped.get((endpoint, counter), 0)


@pytest.fixture
def lab(request: pytest.FixtureRequest) -> Iterator[Lab]:
    context: zmq.Context[Any] = zmq.Context()
    lab = Lab(context, getattr(request, "param", ""))
    try:
        yield lab
    finally:
        lab.close()
        context.destroy(linger=0)


PROMPT = list(range(1, 101))  # 100 tokens: 6 full blocks, a 4-token tail
GENERATED = list(range(5001, 5013))  # 12 tokens complete block 6 (tokens 96..111)
NEXT_TURN = PROMPT + GENERATED + list(range(7001, 7021))  # 20 new tokens < nonCachedTokens


@pytest.mark.parametrize("hashing", ["same-seed", "own-seed"])
def test_decode_engine_generated_blocks_are_accepted_and_the_next_turn_is_cached_there(lab: Lab, hashing: str) -> None:
    first = lab.route(PROMPT, "turn-1")
    headers = dict(first.result.headers)
    assert PREFILL_HEADER in headers  # 100 uncached tokens ≥ 32: P/D
    decode, prefill = lab.name_of(first.primary.id), lab.name_of(headers[PREFILL_HEADER])
    assert decode.startswith("decode") and prefill.startswith("prefill")

    # The prefill engine stores the prompt; its events index as usual.
    prefill_hashes = list(range(1000, 1006))
    lab.publishers[prefill].send(stored(prefill_hashes, None, PROMPT[:96]))
    wait_until(lambda: lab.confirmed_blocks(prefill, PROMPT) == 6, what="prefill engine's blocks indexed")

    # The decode engine announces only its first generated block, parented on the last
    # transferred block: the prefill engine's hash when the engines hash alike, else its own.
    parent = prefill_hashes[-1] if hashing == "same-seed" else 0xDEC0DE0005
    lab.publishers[decode].send(stored([0xDEC0DE0006], parent, PROMPT[96:] + GENERATED))
    how = "exact" if hashing == "same-seed" else "by_tokens"
    wait_until(lambda: lab.counter(decode, f"transfers_confirmed_{how}") == 1, what="transfer confirmed",
               context=lambda: (dict(lab.producer.stats.transport), dict(lab.producer.stats.dropped)))  # fmt: skip
    assert lab.counter(decode, "unknown_parent") == 0

    lab.producer.tick(time.monotonic() + 3600)  # every speculative entry expired: only evidence is left
    assert lab.confirmed_blocks(decode, NEXT_TURN) == 7  # the 6 transferred blocks and the generated one

    second = lab.route(NEXT_TURN, "turn-2")
    assert second.primary.id == first.primary.id  # the decode engine holding the conversation
    assert PREFILL_HEADER not in dict(second.result.headers)  # 132 − 112 = 20 < 32: decode-only
    info = second.ctx.match_info(second.primary.id, lab.producer.match_key)
    assert info is not None and info.cached_block_count == 7

    # A later generated block chains from the first one, the engine's own mapping.
    lab.publishers[decode].send(stored([0xDEC0DE0007], 0xDEC0DE0006, NEXT_TURN[112:128]))
    wait_until(lambda: lab.confirmed_blocks(decode, NEXT_TURN) == 8, what="second generated block indexed")


def test_without_a_pending_transfer_an_unknown_parent_is_still_dropped(lab: Lab) -> None:
    lab.publishers["decode-a"].send(stored([0xABC], 0xDEF, list(range(16))))
    wait_until(lambda: lab.counter("decode-a", "unknown_parent") == 1, what="dropped as unknown_parent")


SHORT_ANSWER = list(range(5001, 5009))  # 8 tokens: 108 < 112, the answer never fills a block
SHORT_NEXT_TURN = PROMPT + SHORT_ANSWER + list(range(7001, 7011))  # 118 tokens, 22 new < 32


def test_the_credit_outlives_speculative_ttl_and_an_answer_that_fills_no_block(lab: Lab) -> None:
    first = lab.route(PROMPT, "turn-1")
    assert PREFILL_HEADER in dict(first.result.headers)
    decode = lab.name_of(first.primary.id)
    # Ten seconds on (the producer's housekeeping told so): far beyond speculativeTTL (2 s), and
    # the decode engine announced nothing — its 8-token answer filled no block.
    lab.producer.tick(time.monotonic() + 10)
    assert lab.producer.speculative.pending() == 0 and lab.producer.credit.pending() == 1

    second = lab.route(SHORT_NEXT_TURN, "turn-2")
    assert second.primary.id == first.primary.id
    assert PREFILL_HEADER not in dict(second.result.headers)  # 118 − 96 = 22 < 32: decode-only
    info = second.ctx.match_info(second.primary.id, lab.producer.match_key)
    assert info is not None and info.cached_block_count == 6

    # The second turn's first whole block completes the first prompt's partial block: the transfer,
    # still pending, is confirmed by it.
    lab.publishers[decode].send(stored([0xDEC0DE0006], 0xDEC0DE0005, SHORT_NEXT_TURN[96:112]))
    wait_until(lambda: lab.counter(decode, "transfers_confirmed_by_tokens") == 1, what="transfer confirmed",
               context=lambda: (dict(lab.producer.stats.transport), dict(lab.producer.stats.dropped)))  # fmt: skip
    assert lab.counter(decode, "unknown_parent") == 0
    assert lab.confirmed_blocks(decode, SHORT_NEXT_TURN) == 7


@pytest.mark.parametrize("lab", ["decodeCreditTTL: 30s"], indirect=True)
def test_an_unconfirmed_credit_is_bounded_by_decode_credit_ttl(lab: Lab) -> None:
    first = lab.route(PROMPT, "turn-1")
    assert PREFILL_HEADER in dict(first.result.headers)
    lab.producer.tick(time.monotonic() + 31)  # past decodeCreditTTL: the credit and its transfer go
    assert lab.producer.credit.pending() == 0 and len(lab.producer.applier.transfers) == 0

    second = lab.route(SHORT_NEXT_TURN, "turn-2")
    assert PREFILL_HEADER in dict(second.result.headers)  # nothing cached any more: P/D again


@pytest.mark.parametrize("lab", ["creditDecodeEngine: false"], indirect=True)
def test_credit_decode_engine_false_is_llm_d_no_credit_and_the_events_dropped(lab: Lab) -> None:
    first = lab.route(PROMPT, "turn-1")
    headers = dict(first.result.headers)
    assert PREFILL_HEADER in headers
    decode, prefill = lab.name_of(first.primary.id), lab.name_of(headers[PREFILL_HEADER])
    assert lab.producer.credit.pending() == 0 and len(lab.producer.applier.transfers) == 0

    lab.publishers[prefill].send(stored(list(range(1000, 1006)), None, PROMPT[:96]))
    wait_until(lambda: lab.confirmed_blocks(prefill, PROMPT) == 6, what="prefill engine's blocks indexed")
    lab.publishers[decode].send(stored([0xDEC0DE0006], 1005, PROMPT[96:] + GENERATED))
    wait_until(lambda: lab.counter(decode, "unknown_parent") == 1, what="dropped as unknown_parent, as llm-d")

    second = lab.route(NEXT_TURN, "turn-2")
    info = second.ctx.match_info(second.primary.id, lab.producer.match_key)
    assert lab.name_of(second.primary.id).startswith("decode")
    assert info is None or info.cached_block_count == 0  # the decode engines hold nothing indexed
    assert PREFILL_HEADER in dict(second.result.headers)  # P/D runs again
