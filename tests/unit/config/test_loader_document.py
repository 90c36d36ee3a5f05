"""The raw document: deprecated aliases, feature gates, the flowControl section.

Ports ``llm-d/llm-d-router: pkg/epp/config/loader/configloader_test.go`` ``TestLoadRawConfiguration``
and ``TestFlowControlConfigIgnoredWarning`` (llm-d's texts are in ``configloader.go`` and
``validation.go``). Each deprecated input is accepted with exactly one warning.
"""

from __future__ import annotations

import pytest
from epp_helpers import config_error, epp, load

from ppc_extproc.config.epp import load_config, load_config_text
from ppc_extproc.plugins.producers.token_producer import TokenProducer

MAX_SCORE = "plugins: [{name: maxScore, type: max-score-picker}]\nschedulingProfiles: [{name: default, plugins: [{pluginRef: maxScore}]}]\n"


def test_deprecated_api_version_loads_with_one_warning() -> None:
    loaded = load_config_text(epp(MAX_SCORE, "inference.networking.x-k8s.io/v1alpha1"))
    assert loaded.warnings == [
        "apiVersion: DEPRECATION: apiVersion inference.networking.x-k8s.io/v1alpha1/EndpointPickerConfig is "
        "deprecated; use llm-d.ai/v1alpha1"
    ]


def test_unknown_api_version_and_kind_are_errors() -> None:
    assert config_error(epp(MAX_SCORE, "v2")).path == "apiVersion"
    error = config_error("apiVersion: llm-d.ai/v1alpha1\nkind: Other\n" + MAX_SCORE)
    assert error.path == "kind"


def test_deprecated_top_level_saturation_detector_loads_with_one_warning() -> None:
    loaded = load(MAX_SCORE + "saturationDetector: {pluginRef: utilization-detector}\n")
    (warning,) = loaded.warnings
    assert warning.startswith("saturationDetector: DEPRECATION: top-level saturationDetector is deprecated, "
                              "use flowControl.saturationDetector instead")


def test_deprecated_top_level_parser_becomes_the_parser_list_with_one_warning() -> None:
    loaded = load(MAX_SCORE + "parser: {pluginRef: openai-parser}\n")
    assert [p.name for p in loaded.pipeline.parsers or []] == ["openai-parser"]
    assert loaded.warnings == [
        "parser: DEPRECATION: top-level parser is deprecated, use requestHandler.parsers instead. "
        "If both are set, the new field is used."
    ]


def test_the_new_parser_list_wins_over_the_deprecated_parser() -> None:
    loaded = load(MAX_SCORE + "parser: {pluginRef: openai-parser}\n"
                  "requestHandler: {parsers: [{pluginRef: anthropic-parser}]}\n")
    assert [p.name for p in loaded.pipeline.parsers or []] == ["anthropic-parser"]
    assert len(loaded.warnings) == 1


def test_the_deprecated_parser_fills_an_empty_parser_list() -> None:
    loaded = load(MAX_SCORE + "parser: {pluginRef: openai-parser}\nrequestHandler: {parsers: []}\n")
    assert [p.name for p in loaded.pipeline.parsers or []] == ["openai-parser"]


def test_deprecated_tokenizer_type_is_a_token_producer_with_one_warning() -> None:
    loaded = load("""
plugins:
- {type: tokenizer, parameters: {modelName: m, vllm: {url: "http://127.0.0.1:8000"}}}
- {type: approx-prefix-cache-producer, parameters: {autoTune: false, blockSizeTokens: 64}}
- {type: prefix-cache-scorer}
""")
    tokenizer = loaded.plugins["tokenizer"]
    assert isinstance(tokenizer, TokenProducer) and tokenizer.type_name == "token-producer"
    assert "token-producer" not in loaded.plugins  # it satisfies TokenizedPrompt: no estimate producer beside it
    (warning,) = loaded.warnings
    assert warning.startswith("plugins[0].type: DEPRECATION: plugin type 'tokenizer' is deprecated; use "
                              "'token-producer' instead")


def test_a_token_producer_under_another_name_warns_once() -> None:
    loaded = load("""
plugins:
- {type: token-producer, name: tok, parameters: {modelName: m, vllm: {url: "http://127.0.0.1:8000"}}}
- {type: approx-prefix-cache-producer, parameters: {autoTune: false, blockSizeTokens: 64}}
- {type: prefix-cache-scorer}
""")
    assert "token-producer" not in loaded.plugins
    (warning,) = loaded.warnings
    assert "'tok'" in warning and "llm-d would also create an estimate 'token-producer'" in warning


# --- feature gates ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("gates", "expected"),
    [
        ("[]", {"flowControl": False, "haPopulateNonLeaderDatastore": True}),
        ("['flowControl=false']", {"flowControl": False, "haPopulateNonLeaderDatastore": True}),
        ("['haPopulateNonLeaderDatastore=false']", {"flowControl": False, "haPopulateNonLeaderDatastore": False}),
        ("['haPopulateNonLeaderDatastore= F ']", {"flowControl": False, "haPopulateNonLeaderDatastore": False}),
        ("['flowControl=TRUE']", {"flowControl": True, "haPopulateNonLeaderDatastore": True}),
        ("[flowControl]", {"flowControl": True, "haPopulateNonLeaderDatastore": True}),
    ],
)
def test_feature_gates(gates: str, expected: dict[str, bool]) -> None:
    loaded = load(MAX_SCORE + f"featureGates: {gates}\n")
    assert loaded.feature_gates == expected
    assert loaded.warnings == []
    assert loaded.flow_control is not None and loaded.flow_control.enabled is expected["flowControl"]


@pytest.mark.parametrize(
    ("gate", "message"),
    [
        ("unknown-gate", "feature gate 'unknown-gate' is unknown or unregistered"),
        ("flowControl=qwerty", "qwerty is not a valid value for the feature gate flowControl"),
        ("flowcontrol", "feature gate 'flowcontrol' is unknown or unregistered"),
    ],
)
def test_feature_gate_errors_are_llm_d_s(gate: str, message: str) -> None:
    error = config_error(epp(MAX_SCORE + f"featureGates: [{gate!r}, flowControl]\n"))
    assert (error.path, error.message) == ("featureGates[0]", message)


# --- flowControl (TestFlowControlConfigIgnoredWarning) ----------------------------------------------

FLOW_CONTROL_IGNORED = ("flowControl: WARNING: the flowControl config section is set but the flowControl feature gate is "
                        "disabled; its settings (other than saturationDetector) are ignored")


@pytest.mark.parametrize(
    ("extra", "warned"),
    [
        ("featureGates: ['flowControl=false']\nflowControl: {maxBytes: '1024'}\n", True),
        ("flowControl: {maxBytes: '1024'}\n", True),
        ("featureGates: ['flowControl=false']\n", False),
        ("featureGates: ['flowControl=false']\nsaturationDetector: {pluginRef: utilization-detector}\n", False),
    ],
    ids=["explicit-opt-out", "disabled-default", "opt-out-no-section", "opt-out-saturation-detector-only"],
)
def test_an_ignored_flow_control_section_is_called_out(extra: str, warned: bool) -> None:
    loaded = load(MAX_SCORE + extra)
    assert (FLOW_CONTROL_IGNORED in loaded.warnings) is warned
    assert sum(w.startswith("flowControl") for w in loaded.warnings) == int(warned)


def test_invalid_yaml_is_an_error() -> None:
    error = config_error("plugins:\n- name: test1\n  type: [unclosed\n")
    assert error.path == "" and "not valid YAML" in error.message


def test_no_configuration_loads_the_embedded_default() -> None:
    loaded = load_config(None)
    assert list(loaded.profiles) == ["default"] and loaded.warnings == []
