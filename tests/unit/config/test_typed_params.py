"""Typed plugin configs: a frozen dataclass of ``param`` fields decodes with ``Section``'s errors."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from ppc_extproc.errors import ConfigError
from ppc_extproc.framework.params import Section, decode, param
from ppc_extproc.plugins.scorers.active_request import ActiveRequestConfig


@dataclass(frozen=True, slots=True)
class Example:
    size: int = param("size", 4, minimum=1)
    ratio: float = param("ratio", 0.5, maximum=1.0)
    on: bool = param("on", False)
    mode: str = param("mode", "a", choices=("a", "b"))


def test_defaults_values_and_case_folded_keys() -> None:
    assert decode(Section({}, "p"), Example) == Example()
    section = Section({"Size": 8, "ratio": 1, "on": True, "mode": "b"}, "plugins[0].parameters", fold_case=True)
    assert decode(section, Example) == Example(8, 1.0, True, "b")
    section.finish()  # every key was read


@pytest.mark.parametrize(("data", "message"), [
    ({"size": 0}, "plugins[0].parameters.size: must be at least 1, got 0"),
    ({"ratio": "x"}, "plugins[0].parameters.ratio: expected a number, got str"),
    ({"on": 1}, "plugins[0].parameters.on: expected true or false, got int"),
    ({"mode": "c"}, "plugins[0].parameters.mode: must be one of 'a', 'b'; got 'c'"),
])
def test_errors_name_the_field_path(data: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        decode(Section(data, "plugins[0].parameters"), Example)
    assert str(caught.value) == message


def test_unknown_keys_are_still_an_error_after_decoding() -> None:
    section = Section({"idleThreshold": 2, "idle": 1}, "plugins[0].parameters", "active-request-scorer")
    assert decode(section, ActiveRequestConfig).idle_threshold == 2
    with pytest.raises(ConfigError, match="unknown key 'idle' of active-request-scorer"):
        section.finish()


@dataclass(frozen=True, slots=True)
class Timed:
    every: float = param("every", "50ms", duration=True)


def test_duration_fields_take_go_durations_or_seconds() -> None:
    assert decode(Section({}, "p"), Timed).every == pytest.approx(0.05)
    assert decode(Section({"every": "1m30s"}, "p"), Timed).every == 90.0
    assert decode(Section({"every": 2}, "p"), Timed).every == 2.0
    with pytest.raises(ConfigError, match=r'^p\.every: expected a duration such as "2s", got bool$'):
        decode(Section({"every": True}, "p"), Timed)


def _plugin_error(plugin: str, parameters: str) -> str:
    from ppc_extproc.config.epp import load_config_text

    text = f"""
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: {plugin}
  parameters: {parameters}
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins: [{{pluginRef: max-score-picker}}]
"""
    with pytest.raises(ConfigError) as caught:
        load_config_text(text)
    return str(caught.value)


@pytest.mark.parametrize(("plugin", "parameters", "message"), [
    ("metrics-data-source", "{interval: 0s}", "plugins[0].parameters.interval: must be positive"),
    ("metrics-data-source", "{port: 70000}", "plugins[0].parameters.port: invalid port 70000: must be between 1 and 65535"),
    ("metrics-data-source", "{scheme: ftp}", "plugins[0].parameters.scheme: must be one of 'http', 'https'; got 'ftp'"),
    ("metrics-data-source", "{clientCertPath: a}",
     "plugins[0].parameters.clientCertPath: clientCertPath and clientKeyPath go together"),
    ("prefix-cache-affinity-filter", "{affinityThreshold: 2}",
     "plugins[0].parameters.affinityThreshold: must be at most 1.0, got 2"),
    ("prefix-cache-affinity-filter", "{maxTTFTPenaltyMs: 5, peakPrefillThroughput: 0}",
     "plugins[0].parameters.peakPrefillThroughput: must be > 0 when maxTTFTPenaltyMs > 0"),
    ("inflight-load-producer", "{outputRatio: -1}", "plugins[0].parameters.outputRatio: must be at least 0.0, got -1"),
    ("approx-prefix-cache-producer", "{lruCapacityPerServer: -1}",
     "plugins[0].parameters.lruCapacityPerServer: must be at least 0, got -1"),
    ("burst-prefix-cache-producer", "{windowDurationMs: 0}",
     "plugins[0].parameters.windowDurationMs: invalid configuration: windowDurationMs must be > 0 and <= 10000 "
     "(current value: 0)"),
    ("file-discovery", "{path: x, pollInterval: 0s}", "plugins[0].parameters.pollInterval: must be positive"),
    ("core-metrics-extractor", "{defaultEngine: nope}",
     "plugins[0].parameters.defaultEngine: defaultEngine 'nope' not found in engineConfigs"),
    ("random-picker", "{maxNumOfEndpoints: x}", "plugins[0].parameters.maxNumOfEndpoints: expected an integer, got str"),
    ("active-request-scorer", "{requestTimeout: 5}", "plugins[0].parameters.requestTimeout: expected a string, got int"),
])
def test_converted_plugins_keep_their_field_path_errors(plugin: str, parameters: str, message: str) -> None:
    assert _plugin_error(plugin, parameters).endswith(message)
