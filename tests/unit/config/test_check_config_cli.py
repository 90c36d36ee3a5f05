"""``ppc-extproc check-config FILE…``: the resolved pipeline of each valid file, the error with its
field path for each invalid one; exit 0 when all are valid, 2 otherwise (run as a child process:
the command configures logging for the whole process)."""

from __future__ import annotations

from pathlib import Path

import pytest
from epp_helpers import HEADER, check_config

VALID = HEADER + """\
plugins:
- {type: decode-filter}
- {type: prefix-cache-scorer}
- {type: queue-scorer}
- {type: precise-prefix-cache-producer, name: precise, parameters: {tokenProcessorConfig: {blockSizeTokens: 16}}}
- {type: prefix-cache-scorer, name: precise-scorer, parameters: {prefixMatchInfoProducerName: precise}}
- {type: max-score-picker, parameters: {maxNumOfEndpoints: 0}}
schedulingProfiles:
- name: default
  plugins: [{pluginRef: decode-filter}, {pluginRef: prefix-cache-scorer, weight: 2}, {pluginRef: precise-scorer, weight: 3},
            {pluginRef: queue-scorer, weight: 1.5}, {pluginRef: max-score-picker}]
"""
INVALID = HEADER + "plugins:\n- {type: max-score-picker, parameters: {maxNumOfEndpoints: many}}\n"
UNSUPPORTED = HEADER + "plugins:\n- {type: max-score-picker}\n- {type: program-aware-fairness}\n"


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    out = {}
    for name, text in (("valid", VALID), ("invalid", INVALID), ("unsupported", UNSUPPORTED)):
        out[name] = tmp_path / f"{name}.yaml"
        out[name].write_text(text)
    return out


def test_a_valid_file_prints_its_resolved_pipeline(files: dict[str, Path]) -> None:
    result = check_config(files["valid"])
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"{files['valid']}: valid"
    body = "\n".join(lines[1:])
    for expected in (
        "  profile handler: single-profile-handler [injected]",
        "  profile default:",
        "    filters: decode-filter",
        "    scorers: prefix-cache-scorer ×2, precise-scorer (prefix-cache-scorer) ×3, queue-scorer ×1.5",
        "    picker:  max-score-picker",
        "  producers, in run order: token-producer [estimate backend] [injected] (async) → "
        "precise (precise-prefix-cache-producer) → approx-prefix-cache-producer [injected] → "
        "inflight-load-producer [injected]",
        "  data sources: (implicit) endpoint-notification-source → [precise, approx-prefix-cache-producer]; "
        "metrics-data-source → [core-metrics-extractor]",
        "  feature gates: flowControl=false, haPopulateNonLeaderDatastore=true",
        "  injected defaults:",
        "    - single-profile-handler 'single-profile-handler': one profile and no handler",
        "    - token-producer 'token-producer': TokenizedPrompt (estimate backend), consumed by approx-prefix-cache-producer",
        "    - dataLayer.sources += {metrics-data-source → [core-metrics-extractor]}",
        "  warnings:",
        "    - plugins[5].parameters.maxNumOfEndpoints: 0 is replaced by 1 (llm-d does the same silently)",
    ):
        assert expected in body.splitlines(), f"missing line {expected!r} in:\n{body}"
    assert "plugins[1]: prefix-cache-scorer 'prefix-cache-scorer' does not set prefixMatchInfoProducerName" in body
    assert "plugins[3]: precise-prefix-cache-producer 'precise' has discoverPods=true" in body
    assert "config_warning" not in result.stdout + result.stderr  # warnings are the report, not log lines
    assert "configurations are valid" not in result.stdout  # one file: no summary


def test_an_invalid_file_prints_the_error_with_its_field_path(files: dict[str, Path]) -> None:
    result = check_config(files["invalid"])
    assert result.returncode == 2
    assert result.stdout.splitlines() == [
        f"{files['invalid']}: invalid",
        "  error: plugins[0].parameters.maxNumOfEndpoints: expected an integer, got str",
    ]


def test_any_invalid_file_makes_the_exit_status_2(files: dict[str, Path], tmp_path: Path) -> None:
    result = check_config(files["valid"], files["unsupported"], tmp_path / "missing.yaml")
    assert result.returncode == 2
    out = result.stdout
    assert f"{files['valid']}: valid" in out
    assert (f"{files['unsupported']}: invalid\n  error: plugins[1].type: plugin type 'program-aware-fairness' "
            "(flow control: ") in out
    assert f"{tmp_path / 'missing.yaml'}: invalid\n  error: cannot read config file" in out
    assert out.rstrip().endswith("1 of 3 configurations are valid")


def test_all_valid_files_exit_0(files: dict[str, Path], tmp_path: Path) -> None:
    other = tmp_path / "default-like.yaml"
    other.write_text(HEADER + "plugins: [{type: random-picker}]\n")
    result = check_config(files["valid"], other)
    assert result.returncode == 0
    assert result.stdout.rstrip().endswith("2 of 2 configurations are valid")
    assert "  producers, in run order: -" in result.stdout.splitlines()
    assert "  data sources: -" in result.stdout.splitlines()
