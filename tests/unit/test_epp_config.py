from __future__ import annotations

import pytest

from ppc_extproc.config.epp import load_config, load_config_text
from ppc_extproc.errors import ConfigError

HEADER = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n"


def test_embedded_default() -> None:
    loaded = load_config(None)
    assert [p.type_name for p in loaded.roles.producers] == [
        "token-producer", "precise-prefix-cache-producer", "inflight-load-producer",  # the last for the scorer
    ]
    assert loaded.roles.producers[0].backend_name == "local"  # chat and text: each model's own tokenizer
    assert loaded.roles.producers[1].config.speculative_indexing
    profile = loaded.profiles["default"]
    assert [(w.scorer.type_name, w.weight) for w in profile.scorers] == [
        ("prefix-cache-scorer", 3.0),
        ("active-request-scorer", 2.0),
        ("no-hit-lru-scorer", 4.0),  # cold prefixes rotate over the endpoints
    ]
    assert profile.scorers[2].scorer.reads == "precise-prefix-cache-producer"
    assert profile.picker.type_name == "max-score-picker"
    assert loaded.warnings == []
    assert loaded.data_layer.polling_sources == []  # in-flight accounting, no /metrics polling by default


def test_plugins_without_profiles_go_into_a_default_profile_with_a_picker() -> None:
    loaded = load_config_text(HEADER + """
plugins:
- type: precise-prefix-cache-producer
- type: prefix-cache-scorer
  parameters: {prefixMatchInfoProducerName: precise-prefix-cache-producer}
""")
    assert list(loaded.profiles) == ["default"]
    profile = loaded.profiles["default"]
    assert [(w.scorer.type_name, w.weight) for w in profile.scorers] == [("prefix-cache-scorer", 1.0)]
    assert profile.picker.type_name == "max-score-picker"
    assert loaded.handler.type_name == "single-profile-handler"


def test_named_plugins_and_weights() -> None:
    loaded = load_config_text(HEADER + """
plugins:
- {type: precise-prefix-cache-producer, name: precise}
- {type: prefix-cache-scorer, name: prefix, parameters: {prefixMatchInfoProducerName: precise}}
- {type: random-picker, name: pick, parameters: {maxNumOfEndpoints: 2}}
schedulingProfiles:
- name: main
  plugins: [{pluginRef: prefix, weight: 5}, {pluginRef: pick}]
""")
    profile = loaded.profiles["main"]
    assert profile.scorers[0].weight == 5.0
    assert profile.picker.max_endpoints == 2
    assert str(profile.scorers[0].scorer.match_key) == "PrefixCacheMatchInfoDataKey/precise"


@pytest.mark.parametrize(
    ("body", "path", "message"),
    [
        ("apiVersion: v2\nkind: EndpointPickerConfig\nplugins: [{type: max-score-picker}]", "apiVersion", "must be one of"),
        (HEADER + "plugins: [{type: no-such-scorer}]", "plugins[0].type", "plugin type 'no-such-scorer' is not registered; supported types: "),
        (HEADER + "plugins: [{type: max-score-picker}, {type: max-score-picker}]", "plugins[1].name", "duplicate plugin name"),
        (HEADER + "plugins: [{type: max-score-picker, parameters: {bogus: 1}}]", "plugins[0].parameters.bogus", "unknown key 'bogus' of max-score-picker"),
        (HEADER + "plugins: [{type: max-score-picker}]\nschedulingProfiles: [{name: a, plugins: [{pluginRef: nope}]}]", "schedulingProfiles[0].plugins[0].pluginRef", "schedulingProfiles[a] references undefined plugin 'nope'"),
        (HEADER + "plugins: [{type: max-score-picker}]\nschedulingProfiles: [{name: a}, {name: b}]", "schedulingProfiles", "no profile handler configured"),
        (HEADER + "plugins: [{type: max-score-picker}, {type: single-profile-handler}]\nschedulingProfiles: [{name: a}, {name: b}]", "schedulingProfiles", "SingleProfileHandler cannot support multiple scheduling profiles"),
        (HEADER + "plugins: [{type: precise-prefix-cache-producer}]\nschedulingProfiles: [{name: a, plugins: [{pluginRef: precise-prefix-cache-producer}]}]", "schedulingProfiles[0].plugins[0].pluginRef", "is a producer"),
        (HEADER + "plugins: [{type: prefix-cache-scorer, parameters: {prefixMatchInfoProducerName: ghost}}]", "plugins[0].parameters.prefixMatchInfoProducerName", "no producer named 'ghost'"),
        (HEADER + "plugins: [{type: max-score-picker}]\nbogus: 1", "bogus", "unknown key 'bogus'"),
        (HEADER + "plugins: []", "plugins", "at least one plugin"),
        (HEADER + "plugins: [{type: max-score-picker}]\ndataLayer: {discovery: {pluginRef: max-score-picker}}", "dataLayer.discovery.pluginRef", "not a discovery plugin"),
        ("plugins: [: x", "", "not valid YAML"),
    ],
)
def test_errors_name_the_field(body: str, path: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config_text(body)
    assert info.value.path == path
    assert message in info.value.message


def test_an_unknown_type_lists_the_supported_ones() -> None:
    with pytest.raises(ConfigError) as info:
        load_config_text(HEADER + "plugins: [{type: no-such-thing}]")
    for supported in ("precise-prefix-cache-producer", "prefix-cache-scorer", "max-score-picker", "file-discovery"):
        assert supported in info.value.message


def test_missing_config_file_is_a_clear_error(tmp_path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "missing.yaml")


def test_ignored_llmd_sections_warn() -> None:
    loaded = load_config_text(HEADER + "flowControl: {maxRequests: 10}\nplugins: [{type: max-score-picker}]")
    assert any(w.startswith("flowControl: ") for w in loaded.warnings)
