"""Building the plugins, profiles, profile handler, picker and parsers of a document.

Ports ``llm-d/llm-d-router: pkg/epp/config/loader/configloader_test.go`` ``TestInstantiateAndConfigure``
(errors of ``validation.go`` and ``configloader.go``): injected profile handler and picker, the
``default`` profile, scorer weights, handler counts, parser lists.
"""

from __future__ import annotations

import pytest
from epp_helpers import config_error, epp, load, pipeline

from ppc_extproc.plugins.parsers import OpenAIParser


def test_explicit_plugins_keep_their_names_weights_and_picker() -> None:
    loaded = load("""
plugins:
- {name: queue, type: queue-scorer}
- {name: pick, type: max-score-picker}
- {name: handler, type: single-profile-handler}
schedulingProfiles: [{name: default, plugins: [{pluginRef: queue, weight: 50}, {pluginRef: pick}]}]
""")
    assert pipeline(loaded)["handler"] == "handler"
    assert pipeline(loaded)["profiles"] == {"default": {"filters": [], "scorers": [("queue", 50.0)], "picker": "pick"}}
    assert not [line for line in loaded.injected if "picker" in line or "handler" in line]


def test_scorer_weight_defaults_to_one_and_a_picker_may_come_first() -> None:
    loaded = load("""
plugins: [{name: queue, type: queue-scorer}, {name: pick, type: random-picker}]
schedulingProfiles: [{name: default, plugins: [{pluginRef: pick}, {pluginRef: queue}]}]
""")
    assert pipeline(loaded)["profiles"]["default"] == {"filters": [], "scorers": [("queue", 1.0)], "picker": "pick"}


def test_single_profile_handler_and_picker_are_injected() -> None:
    loaded = load("plugins: [{name: queue, type: queue-scorer}]\n"
                  "schedulingProfiles: [{name: default, plugins: [{pluginRef: queue}]}]\n")
    assert pipeline(loaded)["handler"] == "single-profile-handler"
    assert pipeline(loaded)["profiles"]["default"]["picker"] == "max-score-picker"
    assert loaded.paths["single-profile-handler"] == loaded.paths["max-score-picker"] == "(injected)"
    assert "single-profile-handler 'single-profile-handler': one profile and no handler" in loaded.injected
    assert "max-score-picker 'max-score-picker': profile 'default' has no picker" in loaded.injected


def test_a_profile_without_a_picker_gets_the_configured_one() -> None:
    loaded = load("""
plugins: [{name: queue, type: queue-scorer}, {name: pick, type: random-picker}]
schedulingProfiles: [{name: default, plugins: [{pluginRef: queue}]}]
""")
    assert pipeline(loaded)["profiles"]["default"]["picker"] == "pick"
    assert "max-score-picker" not in loaded.plugins


def test_no_profiles_give_one_default_profile_of_every_filter_scorer_and_picker() -> None:
    loaded = load("""
plugins:
- {type: decode-filter}
- {type: queue-scorer}
- {type: kv-cache-utilization-scorer}
- {type: random-picker}
- {type: precise-prefix-cache-producer, parameters: {kvEventsConfig: {discoverPods: false}}}
""")
    assert pipeline(loaded)["profiles"] == {
        "default": {
            "filters": ["decode-filter"],
            "scorers": [("queue-scorer", 1.0), ("kv-cache-utilization-scorer", 1.0)],
            "picker": "random-picker",
        }
    }
    assert pipeline(loaded)["handler"] == "single-profile-handler"


def test_a_lone_picker_gets_a_default_profile() -> None:
    loaded = load("plugins: [{type: max-score-picker}]\n")
    assert pipeline(loaded)["profiles"] == {"default": {"filters": [], "scorers": [], "picker": "max-score-picker"}}


@pytest.mark.parametrize(
    ("body", "path", "message"),
    [
        pytest.param("plugins: [{name: test1}]\n", "plugins[0].type", "plugin 'test1' is missing a type", id="missing-type"),
        pytest.param("plugins: [{type: no-such-plugin}]\n", "plugins[0].type",
                     "plugin type 'no-such-plugin' is not registered", id="unknown-type"),
        pytest.param("plugins: [{type: max-score-picker, parameters: {maxNumOfEndpoints: many}}]\n",
                     "plugins[0].parameters.maxNumOfEndpoints", "expected an integer", id="bad-parameters"),
        pytest.param("plugins: [{type: max-score-picker, parameters: [1, 2]}]\n",
                     "plugins[0].parameters", "expected a mapping", id="parameters-not-a-mapping"),
        pytest.param("plugins: [{name: a, type: queue-scorer}, {name: a, type: max-score-picker}]\n",
                     "plugins[1].name", "duplicate plugin name 'a'", id="duplicate-name"),
        pytest.param("plugins: [{type: queue-scorer}]\nschedulingProfiles: [{plugins: [{pluginRef: queue-scorer}]}]\n",
                     "schedulingProfiles[0].name", "needs a name", id="profile-without-name"),
        pytest.param("plugins: [{type: queue-scorer}]\nschedulingProfiles: [{name: p, plugins: [{weight: 2}]}]\n",
                     "schedulingProfiles[0].plugins[0].pluginRef", "missing", id="profile-plugin-without-ref"),
        pytest.param("plugins: [{type: queue-scorer}]\nschedulingProfiles: [{name: p, plugins: [{pluginRef: nope}]}]\n",
                     "schedulingProfiles[0].plugins[0].pluginRef",
                     "schedulingProfiles[p] references undefined plugin 'nope'", id="undefined-ref"),
        pytest.param("plugins: [{type: queue-scorer}]\nschedulingProfiles: [{name: p}, {name: p}]\n",
                     "schedulingProfiles[1].name", "duplicate scheduling profile name 'p'", id="duplicate-profile"),
        pytest.param("plugins: [{name: a, type: max-score-picker}, {name: b, type: random-picker}]\n"
                     "schedulingProfiles: [{name: p, plugins: [{pluginRef: a}, {pluginRef: b}]}]\n",
                     "schedulingProfiles[0].plugins[1].pluginRef", "profile 'p' has a second picker 'b'", id="two-pickers"),
        pytest.param("plugins: [{name: h1, type: single-profile-handler}, {name: h2, type: single-profile-handler},"
                     " {type: max-score-picker}]\n",
                     "plugins[1]", "multiple profile handlers found ('h1', 'h2'); only one is allowed",
                     id="two-handlers"),
        pytest.param("plugins: [{type: max-score-picker}]\nschedulingProfiles: [{name: a}, {name: b}]\n",
                     "schedulingProfiles", "no profile handler configured", id="no-handler"),
        pytest.param("plugins: [{type: max-score-picker}, {type: single-profile-handler}]\n"
                     "schedulingProfiles: [{name: a}, {name: b}]\n",
                     "schedulingProfiles", "SingleProfileHandler cannot support multiple scheduling profiles",
                     id="single-handler-two-profiles"),
        pytest.param("plugins: [{type: max-score-picker}, {type: data-parallel-profile-handler}]\n"
                     "schedulingProfiles: [{name: a}, {name: b}]\n",
                     "schedulingProfiles", "data-parallel-profile-handler runs exactly one scheduling profile",
                     id="dp-handler-two-profiles"),
        pytest.param("plugins: [{type: queue-scorer, weight: 2}]\n", "plugins[0].weight", "unknown key 'weight'",
                     id="unknown-plugin-key"),
        pytest.param("plugins: [{type: queue-scorer}]\nschedulingProfiles: [{name: p, plugins: [{pluginRef: "
                     "queue-scorer, weight: -1}]}]\n", "schedulingProfiles[0].plugins[0].weight", "at least 0",
                     id="negative-weight"),
    ],
)
def test_errors_name_the_field(body: str, path: str, message: str) -> None:
    error = config_error(epp(body))
    assert error.path == path
    assert message in error.message


# --- request parsers ------------------------------------------------------------------------------


def test_without_a_parser_list_every_path_is_handled() -> None:
    assert load("plugins: [{type: max-score-picker}]\n").pipeline.parsers is None


@pytest.mark.parametrize(
    ("body", "names"),
    [
        ("plugins: [{type: max-score-picker}, {type: openai-parser}]\n"
         "requestHandler: {parsers: [{pluginRef: openai-parser}]}\n", ["openai-parser"]),
        ("plugins: [{type: max-score-picker}]\nrequestHandler: {parsers: [{pluginRef: openai-parser}]}\n",
         ["openai-parser"]),
        ("plugins: [{type: max-score-picker}, {name: openaiParser, type: openai-parser}]\n"
         "requestHandler: {parsers: [{pluginRef: openaiParser}]}\n", ["openaiParser"]),
        ("plugins: [{type: max-score-picker}, {name: secondParser, type: anthropic-parser}]\n"
         "requestHandler: {parsers: [{pluginRef: openai-parser}, {pluginRef: secondParser}]}\n",
         ["openai-parser", "secondParser"]),
        ("plugins: [{type: max-score-picker}, {name: myFallback, type: passthrough-parser}]\n"
         "requestHandler: {parsers: [{pluginRef: openai-parser}, {pluginRef: myFallback}]}\n",
         ["openai-parser", "myFallback"]),
    ],
    ids=["declared", "default-type-instantiated", "named", "two", "own-fallback"],
)
def test_an_explicit_parser_list_is_used_as_given(body: str, names: list[str]) -> None:
    loaded = load(body)
    assert [p.name for p in loaded.pipeline.parsers or []] == names
    assert isinstance(loaded.pipeline.parsers[0], OpenAIParser)  # type: ignore[index]


@pytest.mark.parametrize(
    ("parsers", "message"),
    [
        ("[{pluginRef: maxScore}]", "the plugin 'maxScore' is not a parser plugin"),
        ("[{pluginRef: nope-parser}]", "parser references undefined plugin 'nope-parser'"),
    ],
)
def test_parser_errors(parsers: str, message: str) -> None:
    error = config_error(epp(f"plugins: [{{name: maxScore, type: max-score-picker}}]\nrequestHandler: {{parsers: {parsers}}}\n"))
    assert (error.path, error.message) == ("requestHandler.parsers[0]", message)
