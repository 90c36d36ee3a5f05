"""Every plugin's declared data has a producer once a configuration loads, and plugins read shared
state only through what they declare.

Loads llm-d's loadable sample configurations (``test_llmd_sample_configs``), the embedded default
and the compose file's configuration, and checks each consumer's required keys: engine metrics
need a wired metrics extractor, everything else a producer whose key satisfies the need (token ids
included: every sample that reads them gets a token producer).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from test_llmd_sample_configs import LOADABLE, document

from ppc_extproc.config.epp import LoadedConfig, load_config, load_config_text
from ppc_extproc.framework import ENGINE_METRICS, IN_FLIGHT_LOAD, Consumes, DataKey, Plugin, PluginRoles
from ppc_extproc.plugins.datalayer import MetricsDataSource
from ppc_extproc.plugins.producers.inflight_load import InflightLoadProducer

REPO = Path(__file__).resolve().parents[3]
PLUGINS = REPO / "src" / "ppc_extproc" / "plugins"


def needs(loaded: LoadedConfig) -> list[tuple[str, Consumes[object]]]:
    """Every required need of the loaded plugins: consumers' and data sources' own."""
    found = [(c.name, need) for c in loaded.roles.consumers for need in c.consumes() if need.required]
    for source in (*loaded.data_layer.endpoint_sources, *loaded.data_layer.polling_sources):
        found += [(source.name, need) for need in getattr(type(source), "source_consumes", ()) if need.required]
    return found


def unproduced(loaded: LoadedConfig) -> list[str]:
    produced: set[DataKey[object]] = {k for p in loaded.roles.producers for k in p.produces()}
    metrics = bool(loaded.data_layer.metrics_extractors())
    missing = []
    for consumer, need in needs(loaded):
        satisfied = metrics if need.data_type == ENGINE_METRICS else any(need.satisfied_by(k) for k in produced)
        if not satisfied:
            missing.append(f"{consumer}: {need}")
    return missing


def configurations() -> dict[str, LoadedConfig]:
    loaded = {name: load_config_text(document(name), name) for name in sorted(LOADABLE)}
    loaded["<default>"] = load_config(None)
    compose = yaml.safe_load((REPO / "docker-compose.yaml").read_text())
    loaded["docker-compose"] = load_config_text(compose["configs"]["ppc-extproc-config"]["content"], "compose")
    return loaded


@pytest.mark.parametrize("name", [*sorted(LOADABLE), "<default>", "docker-compose"])
def test_every_consumed_key_has_a_producer(name: str) -> None:
    loaded = configurations()[name]
    assert needs(loaded), "every sample reads something"
    assert unproduced(loaded) == []


def test_a_metrics_source_is_built_with_the_in_flight_view_it_declares() -> None:
    for name, loaded in configurations().items():
        for source in loaded.data_layer.polling_sources:
            assert isinstance(source, MetricsDataSource), name
            if source.type_name != "metrics-data-source":  # dcgm-data-source polls at a fixed interval
                continue
            producer = next(p for p in loaded.roles.producers if isinstance(p, InflightLoadProducer))
            assert Consumes(IN_FLIGHT_LOAD, producer.name) in source.source_consumes
            assert source.extractors, f"{name}: {source.name} feeds nothing"


def test_burst_producer_reading_engine_metrics_gets_a_metrics_source() -> None:
    loaded = load_config_text(
        "plugins: [{type: burst-prefix-cache-producer},"
        " {type: prefix-cache-scorer, parameters: {prefixMatchInfoProducerName: burst-prefix-cache-producer}}]\n"
    )
    assert [s.name for s in loaded.data_layer.polling_sources] == ["metrics-data-source"]
    assert unproduced(loaded) == []


def test_only_the_in_flight_load_producer_reads_the_tracker() -> None:
    """The scorers, the affinity filter and the metrics source read in-flight load from the key
    its producer writes (or the view the loader hands a source), never from ``Services``. Two
    exceptions: the saturation detectors (flow control asks them between requests, with no request
    context to carry the key; llm-d's concurrency detector keeps its own counts) and the
    cross-replica syncer (it holds the tracker to publish this replica's counts and set the peers')."""
    readers = sorted(str(p.relative_to(PLUGINS)) for p in PLUGINS.rglob("*.py") if "services.inflight" in p.read_text())
    assert readers == ["datalayer/redis_syncer.py", "flowcontrol/detectors.py", "producers/inflight_load.py"]


def test_each_plugin_is_classified_once_per_load(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []
    add = PluginRoles.add

    def counting(self: PluginRoles, plugin: Plugin) -> None:
        seen.append(plugin.name)
        add(self, plugin)

    monkeypatch.setattr(PluginRoles, "add", counting)
    loaded = load_config_text(document("epp-precise-prefix-cache-config"), "precise")
    assert sorted(seen) == sorted(loaded.plugins)  # injected defaults and data sources included
