"""``dataLayer``: source → extractor wiring rules and the injected metrics defaults.

Ports the cases of ``llm-d/llm-d-router: pkg/epp/config/loader/defaults_test.go``
(``TestEnsureDataLayer``) and the data-layer cases of ``configloader_test.go``
(``TestInstantiateAndConfigure``), with the wiring rules of ``pkg/epp/config/loader/configloader.go``
and ``pkg/epp/datalayer/runtime.go``.
"""

from __future__ import annotations

import pytest
from epp_helpers import config_error, epp, load, pipeline

from ppc_extproc.plugins.datalayer import CoreMetricsExtractor, MetricsDataSource

METRICS = {"metrics-data-source": ["core-metrics-extractor"]}
PRECISE_WIRED = """
  - pluginRef: endpoint-notification-source
    extractors: [{pluginRef: precise-prefix-cache-producer}]
"""


def metrics_plugins(loaded) -> list[str]:  # type: ignore[no-untyped-def]
    return sorted(n for n, p in loaded.plugins.items() if isinstance(p, (MetricsDataSource, CoreMetricsExtractor)))


# --- injected metrics source (TestEnsureDataLayer) ---------------------------------------------------


@pytest.mark.parametrize("data_layer", ["", "dataLayer: {}\n", "dataLayer: {sources: []}\n"])
def test_metrics_source_and_extractor_are_injected_for_a_metrics_reader(data_layer: str) -> None:
    loaded = load("plugins: [{type: queue-scorer}]\n" + data_layer)
    assert pipeline(loaded)["sources"] == METRICS
    assert metrics_plugins(loaded) == ["core-metrics-extractor", "metrics-data-source"]
    assert "dataLayer.sources += {metrics-data-source → [core-metrics-extractor]}" in loaded.injected
    assert loaded.warnings == []


def test_inject_defaults_false_suppresses_the_metrics_source() -> None:
    loaded = load("plugins: [{type: queue-scorer}]\ndataLayer: {injectDefaults: false}\n")
    assert pipeline(loaded)["sources"] == {}
    assert metrics_plugins(loaded) == []
    (warning,) = loaded.warnings
    assert "queue-scorer read engine metrics" in warning and "injectDefaults is false" in warning


def test_a_listed_metrics_data_source_is_not_injected_twice() -> None:
    loaded = load("""
plugins: [{type: queue-scorer}, {type: metrics-data-source}]
dataLayer: {sources: [{pluginRef: metrics-data-source}]}
""")
    assert pipeline(loaded)["sources"] == METRICS  # the listed source got the extractor
    assert len(loaded.data_layer.polling_sources) == 1
    assert loaded.warnings == []


def test_a_fully_wired_metrics_source_needs_only_its_in_flight_load_producer() -> None:
    loaded = load("""
plugins: [{type: queue-scorer}, {type: metrics-data-source}, {type: core-metrics-extractor}]
dataLayer: {sources: [{pluginRef: metrics-data-source, extractors: [{pluginRef: core-metrics-extractor}]}]}
""")
    assert pipeline(loaded)["sources"] == METRICS
    # the source reads the in-flight load (adaptive polling), so its producer is the one default
    assert [line for line in loaded.injected if "metrics" in line] == [
        "inflight-load-producer 'inflight-load-producer': InFlightLoadDataKey/inflight-load-producer, "
        "consumed by metrics-data-source"
    ]
    assert loaded.warnings == []


def test_a_metrics_source_under_another_name_is_matched_by_type() -> None:
    """llm-d compares the reference string and would poll every endpoint twice; ppc-extproc
    matches the source by its type and polls once."""
    loaded = load("""
plugins: [{type: queue-scorer}, {type: metrics-data-source, name: engine-metrics}]
dataLayer: {sources: [{pluginRef: engine-metrics}]}
""")
    assert pipeline(loaded)["sources"] == {"engine-metrics": ["core-metrics-extractor"]}
    assert "metrics-data-source" not in loaded.plugins


def test_a_declared_but_unlisted_metrics_source_is_used_by_the_injection_without_a_warning() -> None:
    loaded = load("plugins: [{type: queue-scorer}, {type: metrics-data-source}]\n")
    assert pipeline(loaded)["sources"] == METRICS
    assert loaded.plugins["metrics-data-source"] in loaded.data_layer.polling_sources
    assert loaded.warnings == []


def test_a_non_metrics_source_gets_the_metrics_source_added() -> None:
    loaded = load(f"""
plugins: [{{type: queue-scorer}}, {{type: endpoint-notification-source}}, {{type: precise-prefix-cache-producer}}]
dataLayer:
  sources:{PRECISE_WIRED}""")
    assert pipeline(loaded)["sources"] == {"endpoint-notification-source": ["precise-prefix-cache-producer"], **METRICS}


def test_no_metrics_reader_no_metrics_source() -> None:
    """ppc-extproc's one divergence from llm-d's injection: nobody reads engine metrics, so nothing
    polls them (llm-d polls every endpoint every 50 ms regardless)."""
    loaded = load("plugins: [{type: random-picker}]\n")
    assert pipeline(loaded)["sources"] == {} and metrics_plugins(loaded) == []


# --- wiring rules ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "path", "message"),
    [
        pytest.param("""
plugins: [{type: endpoint-notification-source}, {type: core-metrics-extractor}]
dataLayer: {sources: [{pluginRef: endpoint-notification-source, extractors: [{pluginRef: core-metrics-extractor}]}]}
""", "dataLayer.sources[0].extractors[0].pluginRef",
            "endpoint source endpoint-notification-source requires an EndpointExtractor; extractor "
            "core-metrics-extractor does not implement it", id="endpoint-source-metrics-extractor"),
        pytest.param("""
plugins: [{type: metrics-data-source}, {type: precise-prefix-cache-producer}]
dataLayer: {sources: [{pluginRef: metrics-data-source, extractors: [{pluginRef: precise-prefix-cache-producer}]}]}
""", "dataLayer.sources[0].extractors[0].pluginRef",
            "polling source metrics-data-source requires a metrics extractor; precise-prefix-cache-producer is not one",
            id="polling-source-endpoint-extractor"),
        pytest.param("""
plugins: [{type: max-score-picker}]
dataLayer: {sources: [{pluginRef: max-score-picker}]}
""", "dataLayer.sources[0].pluginRef", "the plugin max-score-picker is not a data source", id="not-a-source"),
        pytest.param("""
plugins: [{type: max-score-picker}]
dataLayer: {sources: [{pluginRef: ghost-source}]}
""", "dataLayer.sources[0].pluginRef", "the plugin ghost-source is not registered", id="undefined-source"),
        pytest.param("""
plugins: [{type: metrics-data-source}]
dataLayer: {sources: [{pluginRef: metrics-data-source, extractors: [{pluginRef: ghost-extractor}]}]}
""", "dataLayer.sources[0].extractors[0].pluginRef", "the plugin ghost-extractor is not registered",
            id="unregistered-extractor"),
        pytest.param("""
plugins: [{type: metrics-data-source}, {type: core-metrics-extractor, name: a}, {type: core-metrics-extractor, name: b}]
dataLayer: {sources: [{pluginRef: metrics-data-source, extractors: [{pluginRef: a}, {pluginRef: b}]}]}
""", "dataLayer.sources[0].extractors[1]",
            "source metrics-data-source lists two extractors of type core-metrics-extractor ('a' and 'b')",
            id="same-extractor-type-twice"),
        pytest.param("""
plugins: [{type: metrics-data-source}]
dataLayer: {sources: [{extractors: []}]}
""", "dataLayer.sources[0].pluginRef", "missing", id="source-without-ref"),
    ],
)
def test_wiring_errors_name_the_field(body: str, path: str, message: str) -> None:
    error = config_error(epp(body))
    assert error.path == path
    assert message in error.message


def test_an_unwired_precise_producer_gets_the_implicit_source_and_one_warning() -> None:
    loaded = load("plugins: [{type: precise-prefix-cache-producer}, {type: prefix-cache-scorer, "
                  "parameters: {prefixMatchInfoProducerName: precise-prefix-cache-producer}}]\n")
    assert pipeline(loaded)["sources"] == {"(implicit) endpoint-notification-source": ["precise-prefix-cache-producer"]}
    (warning,) = loaded.warnings
    assert warning.startswith("plugins[0]: precise-prefix-cache-producer 'precise-prefix-cache-producer' has "
                              "discoverPods=true but is not an extractor of an endpoint-notification-source")


@pytest.mark.parametrize(
    "params", ["{kvEventsConfig: {zmqEndpoint: 'tcp://0.0.0.0:5557'}}", "{kvEventsConfig: {discoverPods: false}}"]
)
def test_an_unwired_precise_producer_that_needs_no_pod_events_is_not_warned_about(params: str) -> None:
    loaded = load(f"plugins: [{{type: precise-prefix-cache-producer, parameters: {params}}}, {{type: prefix-cache-scorer, "
                  "parameters: {prefixMatchInfoProducerName: precise-prefix-cache-producer}}]\n")
    assert "(implicit) endpoint-notification-source" in pipeline(loaded)["sources"]
    assert loaded.warnings == []


def test_a_wired_precise_producer_gets_no_implicit_source() -> None:
    loaded = load(f"""
plugins: [{{type: endpoint-notification-source}}, {{type: precise-prefix-cache-producer}},
          {{type: prefix-cache-scorer, parameters: {{prefixMatchInfoProducerName: precise-prefix-cache-producer}}}}]
dataLayer:
  sources:{PRECISE_WIRED}""")
    assert pipeline(loaded)["sources"] == {"endpoint-notification-source": ["precise-prefix-cache-producer"]}
    assert loaded.warnings == []


def test_a_declared_but_unlisted_source_warns() -> None:
    loaded = load("plugins: [{type: endpoint-notification-source}, {type: random-picker}]\n")
    assert loaded.warnings == [
        "plugins[0]: data source 'endpoint-notification-source' is not listed under dataLayer.sources, "
        "so nothing reads from it"
    ]
