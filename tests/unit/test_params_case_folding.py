"""Plugin parameter keys match case-insensitively, as Go's ``encoding/json`` decodes llm-d's
parameters; an exact match wins over a case-folded one; unknown keys still name their path."""

from __future__ import annotations

import pytest
from epp_helpers import config_error, epp

from ppc_extproc.config.epp import load_config_text
from ppc_extproc.errors import ConfigError
from ppc_extproc.framework.params import Section


def test_folded_keys_are_read_and_count_as_known() -> None:
    section = Section({"PODCACHESIZE": 4, "Nested": {"SocketPort": 7}}, "p", fold_case=True)
    assert section.integer("podCacheSize", 10) == 4
    assert section.section("nested").integer("socketPort", 1) == 7
    section.finish()


def test_an_exact_match_wins_over_a_folded_one() -> None:
    section = Section({"Threshold": 1, "threshold": 2}, "p", fold_case=True)
    assert section.integer("threshold", 0) == 2


def test_without_folding_keys_are_exact() -> None:
    section = Section({"Threshold": 1}, "p")
    assert section.integer("threshold", 9) == 9
    with pytest.raises(ConfigError, match="unknown key 'Threshold'"):
        section.finish()


def test_a_config_with_go_style_key_case_loads() -> None:
    loaded = load_config_text(epp(
        "plugins:\n"
        "- {type: token-load-scorer, parameters: {QueueThresholdTokens: 1000}}\n"
        "- type: precise-prefix-cache-producer\n"
        "  parameters: {TokenProcessorConfig: {blocksizetokens: 32}, kvEventsConfig: {DiscoverPods: false},\n"
        "               indexerConfig: {kvCacheBackendConfigs: [{NAME: gpu, Weight: 1.0}]}}\n"
        "- {type: max-score-picker}\n"
        "schedulingProfiles:\n"
        "- {name: default, plugins: [{pluginRef: token-load-scorer}]}\n"
    ))
    scorer = next(p for p in loaded.plugins.values() if p.name == "token-load-scorer")
    assert scorer.queue_threshold_tokens == 1000  # type: ignore[attr-defined]
    producer = next(p for p in loaded.plugins.values() if p.name == "precise-prefix-cache-producer")
    assert producer.config.token_processor.block_size_tokens == 32  # type: ignore[attr-defined]


def test_unknown_keys_still_error_with_their_path() -> None:
    error = config_error(epp("plugins: [{type: token-load-scorer, parameters: {QueueThreshold: 1}}]\n"))
    assert error.path == "plugins[0].parameters.QueueThreshold"
    assert "unknown key 'QueueThreshold'" in error.message
