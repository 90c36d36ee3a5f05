"""``lora-affinity-scorer`` (llm-d's four levels from ``vllm:lora_requests_info``) and the multimodal
embeddings cache (producer LRU per endpoint, scorer = matched / request items)."""

from __future__ import annotations

import asyncio

import orjson
import pytest
from epp_helpers import load, router_for

from ppc_extproc.enginemetrics import EngineMetrics, EngineMetricsStore
from ppc_extproc.framework import Endpoint, EndpointEvent, EndpointEventKind, LLMRequest, SchedulingContext
from ppc_extproc.plugins.datalayer.core_metrics_extractor import CoreMetricsExtractor
from ppc_extproc.plugins.producers.mm_embeddings_cache import MMEmbeddingsCacheProducer, lru_capacity
from ppc_extproc.plugins.registry import Services
from ppc_extproc.plugins.scorers.lora_affinity import LoraAffinityScorer
from ppc_extproc.plugins.scorers.mm_embeddings_cache import MMEmbeddingsCacheScorer
from ppc_extproc.tokens import TokenizedPrompt
from ppc_extproc.tokens.le32 import tokens_to_le32
from ppc_extproc.tokens.prompt import MultimodalFeature

PODS = [Endpoint(f"10.0.0.{i}", 8000) for i in range(1, 6)]


def lora(active: tuple[str, ...], waiting: tuple[str, ...], max_lora: int | None) -> EngineMetrics:
    return EngineMetrics(0, 0, 0.0, None, None, 0.0, active_models=active, waiting_models=waiting,
                         max_active_models=max_lora)  # fmt: skip


def scores_for(store: EngineMetricsStore, model: str, endpoints: list[Endpoint]) -> dict[str, float]:
    scorer = LoraAffinityScorer("lora-affinity-scorer", store)
    return dict(scorer.score(SchedulingContext(LLMRequest("r", model), endpoints), endpoints))


def test_lora_levels_match_llm_d_s_mixed_case() -> None:
    """llm-d's ``lora_affinity_test.go`` mixed case: active 1.0; room beats waiting (0.8 even when
    the adapter waits there); waiting without room 0.6; full 0.0."""
    store = EngineMetricsStore(stale_after_seconds=None)
    store.set(PODS[0].id, lora(("active-model-1",), (), 5))
    store.set(PODS[1].id, lora(("active-model-2",), ("active-model-1",), 5))
    store.set(PODS[2].id, lora(("active-model-2",), (), 2))
    store.set(PODS[3].id, lora(("active-model-3",), ("active-model-1",), 2))
    store.set(PODS[4].id, lora(("active-model-4", "active-model-5"), (), 2))
    assert list(scores_for(store, "active-model-1", PODS).values()) == [1.0, 0.8, 0.8, 0.6, 0.0]


def test_lora_without_lora_info_scores_zero_and_unknown_endpoints_get_the_mean() -> None:
    store = EngineMetricsStore(stale_after_seconds=None)
    store.set(PODS[0].id, lora((), (), None))  # vanilla vLLM: no lora_requests_info family
    store.set(PODS[1].id, lora(("a",), (), 4))
    scores = scores_for(store, "a", PODS[:3])  # PODS[2] never polled
    assert scores == {PODS[0].id: 0.0, PODS[1].id: 1.0, PODS[2].id: 0.5}


def test_lora_info_parsed_from_vllm_metrics_routes_to_the_engine_holding_the_adapter() -> None:
    """llm-d's integration-test default config (``test/integration/epp/testdata/default-config.yaml``)
    with the engines' ``vllm:lora_requests_info``: the newest series wins (its value is a creation
    time), and the adapter's engine beats an otherwise equal one."""
    services = Services(engine_metrics=EngineMetricsStore(stale_after_seconds=None))
    loaded = load("""
plugins:
- {type: queue-scorer}
- {type: kv-cache-utilization-scorer}
- {type: lora-affinity-scorer}
schedulingProfiles:
- {name: default, plugins: [{pluginRef: queue-scorer}, {pluginRef: kv-cache-utilization-scorer}, {pluginRef: lora-affinity-scorer}]}
""", services)  # fmt: skip
    extractor = next(p for p in loaded.plugins.values() if isinstance(p, CoreMetricsExtractor))
    base = b"vllm:num_requests_waiting 0\nvllm:num_requests_running 1\nvllm:kv_cache_usage_perc 0.2\n"
    old = b'vllm:lora_requests_info{max_lora="1",running_lora_adapters="sql-lora",waiting_lora_adapters=""} 1.0e9\n'
    new = b'vllm:lora_requests_info{max_lora="1",running_lora_adapters="tweet-lora",waiting_lora_adapters=""} 2.0e9\n'
    a, b = PODS[0], PODS[1]
    extractor.extract_metrics(a, base + old + new, 0.0)  # a now runs tweet-lora only (full)
    extractor.extract_metrics(b, base + b'vllm:lora_requests_info{max_lora="1",running_lora_adapters="sql-lora",'
                                        b'waiting_lora_adapters=""} 1.5e9\n', 0.0)  # fmt: skip
    router = router_for(loaded, [a, b])
    prompt = TokenizedPrompt("sql-lora", (tokens_to_le32(range(64)),))
    decision = asyncio.run(router.route(LLMRequest("r1", "sql-lora", prompt)))
    assert decision.primary == b
    assert decision.result.primary.scores["lora-affinity-scorer"] == {a.id: 0.0, b.id: 1.0}


# --- multimodal embeddings cache -----------------------------------------------------------------


def mm_request(request_id: str, *hashes: str) -> LLMRequest:
    features = tuple(MultimodalFeature(h, 4 * i, 4) for i, h in enumerate(hashes))
    return LLMRequest(request_id, "m", TokenizedPrompt("m", (tokens_to_le32(range(32)),), features))


MM_CONFIG = """
plugins:
- {type: mm-embeddings-cache-producer, parameters: {cacheSizeInMBPerServer: 4}}
- {type: mm-embeddings-cache-scorer}
- {type: max-score-picker}
schedulingProfiles:
- {name: default, plugins: [{pluginRef: mm-embeddings-cache-scorer}, {pluginRef: max-score-picker}]}
"""


def test_mm_capacity_follows_llm_d_s_two_mib_per_item() -> None:
    assert lru_capacity(4096) == 2048 and lru_capacity(0) == lru_capacity(-5) == 2048 and lru_capacity(1) == 1


def test_mm_scores_the_share_of_items_an_endpoint_encoded_before() -> None:
    loaded = load(MM_CONFIG)
    producer = loaded.plugins["mm-embeddings-cache-producer"]
    assert isinstance(producer, MMEmbeddingsCacheProducer) and producer.capacity == 2
    a, b = PODS[0], PODS[1]
    router = router_for(loaded, [a, b])
    first = asyncio.run(router.route(mm_request("r1", "img-1", "img-2")))
    holder, other = first.primary, (b if first.primary == a else a)
    # the same image twice counts once; one of the two items is on the holder
    second = asyncio.run(router.route(mm_request("r2", "img-1", "img-1", "img-3")))
    assert second.result.primary.scores["mm-embeddings-cache-scorer"] == {holder.id: 0.5, other.id: 0.0}
    assert second.primary == holder
    # capacity 2 per endpoint: img-2 (least recent) was evicted by img-3
    third = asyncio.run(router.route(mm_request("r3", "img-2")))
    assert third.result.primary.scores["mm-embeddings-cache-scorer"][holder.id] == 0.0
    text_only = asyncio.run(router.route(LLMRequest("r4", "m", TokenizedPrompt("m", (tokens_to_le32(range(8)),)))))
    assert set(text_only.result.primary.scores["mm-embeddings-cache-scorer"].values()) == {0.0}


def test_mm_deleted_endpoint_is_forgotten() -> None:
    producer = MMEmbeddingsCacheProducer(capacity=8)
    producer.record([PODS[0].id, PODS[1].id], ["x"])
    producer.extract(EndpointEvent(EndpointEventKind.DELETED, PODS[0]))
    assert producer.items_per_endpoint() == {PODS[1].id: 1}


def test_mm_scorer_alone_gets_llm_d_s_default_producer() -> None:
    loaded = load("""
plugins:
- {type: mm-embeddings-cache-scorer}
schedulingProfiles:
- {name: default, plugins: [{pluginRef: mm-embeddings-cache-scorer}]}
""")  # fmt: skip
    assert isinstance(loaded.plugins["mm-embeddings-cache-producer"], MMEmbeddingsCacheProducer)
    assert loaded.paths["mm-embeddings-cache-producer"] == "(injected)"
    assert isinstance(loaded.plugins["mm-embeddings-cache-scorer"], MMEmbeddingsCacheScorer)


@pytest.mark.parametrize(
    ("params", "capacity", "warning"),
    [
        ("{cacheSizeInMB: 2048}", 1024, "write cacheSizeInMBPerServer: 2048"),
        ("{cacheSizeInMB: 2048, cacheSizeInMBPerServer: 64}", 32, "ignored: cacheSizeInMBPerServer is set"),
    ],
)
def test_mm_sample_s_cache_size_in_mb_warns_and_names_the_right_key(params: str, capacity: int, warning: str) -> None:
    """llm-d's sample still writes the pre-rename key; llm-d's strict decoder rejects it."""
    loaded = load(f"""
plugins:
- {{type: mm-embeddings-cache-producer, parameters: {params}}}
- {{type: mm-embeddings-cache-scorer}}
""")  # fmt: skip
    producer = loaded.plugins["mm-embeddings-cache-producer"]
    assert isinstance(producer, MMEmbeddingsCacheProducer) and producer.capacity == capacity
    assert any("plugins[0].parameters.cacheSizeInMB" in w and warning in w for w in loaded.warnings)


def test_mm_items_from_a_generate_body_s_mm_hashes_follow_the_image_through_the_stream() -> None:
    """``/inference/v1/generate`` carries the items as ``features.mm_hashes``: the second request
    with the same image goes where the first was encoded, whichever endpoint that was."""
    from epp_helpers import extproc_request
    from integration.extproc.harness import metadata_destination

    loaded = load(MM_CONFIG)
    producer = loaded.plugins["mm-embeddings-cache-producer"]
    assert isinstance(producer, MMEmbeddingsCacheProducer)
    router = router_for(loaded, PODS[:3])

    def generate(image: str) -> bytes:
        features = {"mm_hashes": {"image": [image]}, "mm_placeholders": {"image": [{"offset": 2, "length": 4}]}}
        return orjson.dumps({"model": "m", "token_ids": list(range(16)), "features": features})

    def route(image: str) -> str:
        replies = asyncio.run(extproc_request(router, "/inference/v1/generate", generate(image)))
        (destination,) = [d for d in map(metadata_destination, replies) if d]
        return destination

    first = route("cat")
    assert producer.items_per_endpoint() == {first: 1}  # the stream's features reached the producer
    assert route("cat") == first
