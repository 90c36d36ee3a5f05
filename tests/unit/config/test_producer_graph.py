"""Producers of the data consumers need: default producers created on demand, run order by data,
cycles, and independence from the order plugins are written in.

Ports ``llm-d/llm-d-router: pkg/epp/datalayer/data_graph_test.go`` (``TestCreateMissingDataProducers``,
``…_Transitive``, ``…_MayConsume``, ``TestDAGAndTopologicalOrder``) with the throwaway producer
types of ``fw_plugins``.
"""

from __future__ import annotations

import asyncio
import random

import fw_plugins
import pytest
import yaml
from epp_helpers import config_error, epp, load, pipeline, router_for

from ppc_extproc.config.epp import LoadedConfig, load_config_text
from ppc_extproc.enginemetrics import EngineMetrics
from ppc_extproc.events.wire import BlockStored, EventBatch
from ppc_extproc.framework import Endpoint, LLMRequest
from ppc_extproc.plugins.producers.token_producer import TokenProducer
from ppc_extproc.plugins.registry import Services
from ppc_extproc.tokens import TokenizedPrompt
from ppc_extproc.tokens.le32 import tokens_to_le32

A, B, C = Endpoint("10.0.0.1", 8000), Endpoint("10.0.0.2", 8000), Endpoint("10.0.0.3", 8000)
APPROX = "{type: approx-prefix-cache-producer, parameters: {autoTune: false, blockSizeTokens: 64}}"


def producers(loaded: LoadedConfig) -> list[str]:
    return pipeline(loaded)["producers"]  # type: ignore[no-any-return]


# --- default producers (TestCreateMissingDataProducers) ---------------------------------------------


def test_an_estimating_consumer_gets_the_estimate_token_producer() -> None:
    loaded = load(f"plugins: [{APPROX}, {{type: prefix-cache-scorer}}]\n")
    assert producers(loaded) == ["token-producer[estimate]", "approx-prefix-cache-producer"]
    assert loaded.paths["token-producer"] == "(injected)"
    assert ("token-producer 'token-producer': TokenizedPrompt (estimate backend), consumed by "
            "approx-prefix-cache-producer") in loaded.injected


def test_an_exact_consumer_gets_no_estimate_token_producer() -> None:
    """Estimated ids could never match a KV event: the precise producer reads body token ids."""
    loaded = load("plugins: [{type: precise-prefix-cache-producer}, {type: prefix-cache-scorer, "
                  "parameters: {prefixMatchInfoProducerName: precise-prefix-cache-producer}}]\n")
    assert producers(loaded) == ["precise-prefix-cache-producer"]
    assert "token-producer" not in loaded.plugins


def test_a_configured_token_producer_is_not_duplicated() -> None:
    loaded = load(f"plugins: [{{type: token-producer, parameters: {{estimate: {{}}}}}}, {APPROX}, {{type: prefix-cache-scorer}}]\n")
    assert producers(loaded) == ["token-producer[estimate]", "approx-prefix-cache-producer"]
    assert loaded.paths["token-producer"] == "plugins[0]"


def test_default_producers_are_created_transitively() -> None:
    """The scorer needs approximate match info, whose producer needs token ids."""
    loaded = load("plugins: [{type: prefix-cache-scorer}]\n")
    assert producers(loaded) == ["token-producer[estimate]", "approx-prefix-cache-producer"]
    assert {loaded.paths["token-producer"], loaded.paths["approx-prefix-cache-producer"]} == {"(injected)"}
    assert isinstance(loaded.plugins["token-producer"], TokenProducer)


def test_nothing_is_created_without_consumers() -> None:
    loaded = load("plugins: [{type: random-picker}, {type: fwtests-e}]\n")
    assert producers(loaded) == ["fwtests-e"]
    assert not [line for line in loaded.injected if "producer" in line]
    # a load scorer reads engine metrics, whose source reads the in-flight load: one default producer
    metrics = load("plugins: [{type: queue-scorer}, {type: fwtests-e}]\n")
    assert producers(metrics) == ["fwtests-e", "inflight-load-producer"]


def test_required_data_nobody_produces_is_an_error() -> None:
    error = config_error(epp("plugins: [{type: max-score-picker}, {type: fwtests-needs-nobody}]\n"))
    assert error.path == "plugins[1]"
    assert "FwNobody/*, consumed by fwtests-needs-nobody" in error.message


def test_optional_data_nobody_produces_is_fine() -> None:
    loaded = load("plugins: [{type: max-score-picker}, {type: fwtests-may-need-nobody}]\n")
    assert producers(loaded) == ["fwtests-may-need-nobody"]


# --- run order (TestDAGAndTopologicalOrder) -----------------------------------------------------------


def test_producers_run_after_the_producers_of_their_data() -> None:
    loaded = load("plugins: [{type: fwtests-c}, {type: fwtests-d}, {type: fwtests-e}, {type: fwtests-b}, {type: fwtests-a}]\n")
    order = producers(loaded)
    assert sorted(order) == ["fwtests-a", "fwtests-b", "fwtests-c", "fwtests-d", "fwtests-e"]
    assert order.index("fwtests-a") < order.index("fwtests-b") < order.index("fwtests-c")
    assert order.index("fwtests-a") < order.index("fwtests-d")
    decision = asyncio.run(router_for(loaded, [A]).route(LLMRequest("r", "m")))
    assert fw_plugins.ran(decision.ctx) == order  # the router runs them in that order


def test_the_token_producer_runs_before_the_precise_producer_whatever_the_order() -> None:
    loaded = load("""
plugins:
- {type: precise-prefix-cache-producer, parameters: {kvEventsConfig: {discoverPods: false}}}
- {type: prefix-cache-scorer, parameters: {prefixMatchInfoProducerName: precise-prefix-cache-producer}}
- {type: token-producer, parameters: {modelName: m, vllm: {url: "http://127.0.0.1:8000"}}}
""")
    assert producers(loaded) == ["token-producer[vllm]", "precise-prefix-cache-producer"]


def test_a_dependency_cycle_is_rejected() -> None:
    error = config_error(epp("plugins: [{type: max-score-picker}, {type: fwtests-x}, {type: fwtests-y}]\n"))
    assert error.path == "plugins[1]"
    assert error.message == "producer dependency cycle among: fwtests-x → fwtests-y"


# --- YAML order does not matter ---------------------------------------------------------------------

RICH = """
plugins:
- {type: endpoint-notification-source}
- {type: precise-prefix-cache-producer, parameters: {tokenProcessorConfig: {blockSizeTokens: 16}}}
- {type: prefix-cache-scorer, name: precise-scorer, parameters: {prefixMatchInfoProducerName: precise-prefix-cache-producer}}
- {type: prefix-cache-scorer}
- {type: no-hit-lru-scorer, parameters: {prefixMatchInfoProducerName: precise-prefix-cache-producer}}
- {type: queue-scorer}
- {type: decode-filter}
- {type: max-score-picker}
- {type: single-profile-handler}
- {type: fwtests-c}
- {type: fwtests-b}
- {type: fwtests-a}
dataLayer:
  sources: [{pluginRef: endpoint-notification-source, extractors: [{pluginRef: precise-prefix-cache-producer}]}]
schedulingProfiles:
- name: default
  plugins: [{pluginRef: decode-filter}, {pluginRef: precise-scorer, weight: 3}, {pluginRef: prefix-cache-scorer, weight: 1},
            {pluginRef: no-hit-lru-scorer, weight: 1}, {pluginRef: queue-scorer, weight: 2}, {pluginRef: max-score-picker}]
"""


def _shuffled(text: str, seed: int) -> str:
    document = yaml.safe_load(text)
    random.Random(seed).shuffle(document["plugins"])
    return epp(yaml.safe_dump(document, sort_keys=False))


def _outcome(loaded: LoadedConfig) -> dict[str, object]:
    """What a load decides, in terms that do not mention YAML positions."""
    summary = pipeline(loaded)
    order = summary.pop("producers")
    after = {(a, b) for i, a in enumerate(order) for b in order[i + 1 :]}
    must = {("token-producer[estimate]", "approx-prefix-cache-producer"), ("token-producer[estimate]", "precise-prefix-cache-producer"),
            ("fwtests-a", "fwtests-b"), ("fwtests-b", "fwtests-c")}  # fmt: skip
    assert must <= after, order
    return {
        **summary,
        "producers": sorted(order),
        "injected": sorted(loaded.injected),
        "warnings": sorted(w.split(": ", 1)[1] for w in loaded.warnings),
        "types": {name: p.type_name for name, p in loaded.plugins.items()},
    }


def _route(loaded: LoadedConfig) -> list[tuple[str, dict[str, float]]]:
    """Routes three requests (the second repeats the first) after one KV event; the picks and totals."""
    services = loaded.services
    for endpoint, waiting in ((A, 0), (B, 3), (C, 1)):
        services.engine_metrics.set(endpoint.id, EngineMetrics(waiting, 0, 0.1, 16, 100, updated_at=services.clock()))
    router = router_for(loaded, [A, B, C])
    loaded.plugins["no-hit-lru-scorer"]._rng = random.Random(0)  # type: ignore[attr-defined]  # the same order in both
    precise = loaded.plugins["precise-prefix-cache-producer"]
    precise.applier.apply_batch(B.id, "m", EventBatch(0.0, [BlockStored([1, 2], None, list(range(32)), 16)]))  # type: ignore[attr-defined]
    picks = []
    for i, tokens in enumerate((range(64), range(64), range(500, 600))):
        request = LLMRequest(f"r{i}", "m", TokenizedPrompt("m", (tokens_to_le32(tokens),)))
        decision = asyncio.run(router.route(request))
        picks.append((decision.destination, decision.result.primary.totals))
        router.response_complete(decision.ctx, _done(decision))
    return picks


def _done(decision):  # type: ignore[no-untyped-def]
    from ppc_extproc.framework import ResponseInfo

    return ResponseInfo(decision.ctx.request.request_id, decision.primary.id)


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_plugin_order_in_the_document_changes_nothing(seed: int) -> None:
    baseline = load_config_text(epp(RICH), services=Services())
    shuffled = load_config_text(_shuffled(RICH, seed), services=Services())
    assert _outcome(shuffled) == _outcome(baseline)
    assert _route(shuffled) == _route(baseline)
