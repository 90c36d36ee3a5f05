"""llm-d's integration-test default config (``llm-d/llm-d-router:
test/integration/epp/testdata/default-config.yaml``, verbatim) loads, passes ``check-config`` and
resolves to the pipeline llm-d builds from it: the four scorers at weight 1, the injected handler,
picker, approximate producer and metrics source, and only the OpenAI parser.

Its siblings (``datalayer-config.yaml``, ``request-attribute-reporter-config.yaml``, the inline
config of ``grpc_test.go``) source metrics from ``mock-metrics-source``, a plugin the Go test
harness registers for itself; they are not deployable configs.
"""

from __future__ import annotations

from pathlib import Path

from epp_helpers import check_config, pipeline

from ppc_extproc.config.epp import load_config_text

DEFAULT_CONFIG = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
  - type: queue-scorer
  - type: kv-cache-utilization-scorer
  - type: prefix-cache-scorer
  - type: lora-affinity-scorer
  - type: openai-parser
schedulingProfiles:
  - name: default
    plugins:
      - pluginRef: queue-scorer
      - pluginRef: kv-cache-utilization-scorer
      - pluginRef: prefix-cache-scorer
      - pluginRef: lora-affinity-scorer
requestHandler:
  parsers:
  - pluginRef: openai-parser
"""


def test_integration_default_config_resolves_as_in_llm_d() -> None:
    loaded = load_config_text(DEFAULT_CONFIG, "default-config")
    assert pipeline(loaded) == {
        "handler": "single-profile-handler",
        "profiles": {"default": {
            "filters": [],
            "scorers": [("queue-scorer", 1.0), ("kv-cache-utilization-scorer", 1.0), ("prefix-cache-scorer", 1.0),
                        ("lora-affinity-scorer", 1.0)],
            "picker": "max-score-picker",
        }},
        "producers": ["token-producer[estimate]", "approx-prefix-cache-producer", "inflight-load-producer"],
        "sources": {"(implicit) endpoint-notification-source": ["approx-prefix-cache-producer"],
                    "metrics-data-source": ["core-metrics-extractor"]},
    }  # fmt: skip
    assert [p.name for p in loaded.pipeline.parsers or ()] == ["openai-parser"]


def test_check_config_accepts_the_integration_default_config(tmp_path: Path) -> None:
    file = tmp_path / "default-config.yaml"
    file.write_text(DEFAULT_CONFIG)
    result = check_config(file)
    assert result.returncode == 0, result.stdout + result.stderr
    assert ": valid\n" in result.stdout and "lora-affinity-scorer ×1" in result.stdout
