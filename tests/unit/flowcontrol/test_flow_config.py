"""The ``flowControl`` section as llm-d decodes it (``apix/config/v1alpha1/endpointpickerconfig_types.go``,
``pkg/epp/config/loader/flowcontrol.go``): quantities, defaults, band templates, references."""

from __future__ import annotations

import pytest
from epp_helpers import config_error, epp, load

from ppc_extproc.errors import ConfigError
from ppc_extproc.flowcontrol.config import DEFAULT_BAND_MAX_BYTES, DEFAULT_BAND_MAX_REQUESTS, parse_quantity
from ppc_extproc.plugins.flowcontrol.fairness import GlobalStrictFairness, RoundRobinFairness
from ppc_extproc.plugins.flowcontrol.ordering import EdfOrdering, FcfsOrdering
from ppc_extproc.plugins.flowcontrol.usage_limits import StaticUsageLimitPolicy

PICKER = "plugins: [{type: max-score-picker}]\n"
GATE = "featureGates: [flowControl]\n"


@pytest.mark.parametrize(("text", "value"), [
    (5000, 5000), ("1k", 1000), ("1Gi", 2**30), ("500M", 500_000_000), ("1G", 10**9), ("1.5k", 1500), ("0", 0),
    ("100m", 1),  # Quantity.Value() rounds up
])
def test_quantities(text: object, value: int) -> None:
    assert parse_quantity(text, "f") == value


@pytest.mark.parametrize("bad", ["lots", "-1", True, "1 Gb"])
def test_bad_quantities_name_the_field(bad: object) -> None:
    with pytest.raises(ConfigError) as error:
        parse_quantity(bad, "flowControl.maxBytes")
    assert error.value.path == "flowControl.maxBytes"


def test_defaults_and_injected_policies() -> None:
    loaded = load(PICKER + GATE)
    plan = loaded.flow_control
    assert plan is not None and plan.enabled and plan.policies is not None
    spec = plan.spec
    assert (spec.max_bytes, spec.max_requests, spec.default_ttl, spec.no_endpoint_ttl) == (0, 0, 60.0, 60.0)
    band = spec.band_for(3)
    assert (band.max_bytes, band.max_requests) == (DEFAULT_BAND_MAX_BYTES, DEFAULT_BAND_MAX_REQUESTS)
    assert isinstance(plan.policies.default_fairness, GlobalStrictFairness)
    assert isinstance(plan.policies.default_ordering, FcfsOrdering)
    assert isinstance(plan.policies.usage_limit, StaticUsageLimitPolicy) and plan.policies.usage_limit.threshold == 1.0
    assert plan.policies.detector.type_name == "utilization-detector"
    assert sum("flow-control default" in line for line in loaded.injected) == 4
    assert spec.inflight_credit and spec.band_starvation_limit == 20


def test_bands_templates_and_ttls() -> None:
    loaded = load(GATE + """\
plugins:
- {type: max-score-picker}
- {type: round-robin-fairness-policy, name: rr}
- {type: edf-ordering-policy}
flowControl:
  maxBytes: 10Gi
  maxRequests: 1k
  defaultRequestTTL: 30s
  defaultPriorityBand: {maxRequests: 100, fairnessPolicyRef: rr}
  defaultNegativePriorityBand: {maxRequests: "10", maxBytes: 1Mi}
  priorityBands:
  - {priority: 5, maxRequests: 0, orderingPolicyRef: edf-ordering-policy}
  bandStarvationLimit: 0
""")
    plan = loaded.flow_control
    assert plan is not None and plan.policies is not None
    spec = plan.spec
    assert (spec.max_bytes, spec.max_requests, spec.default_ttl, spec.no_endpoint_ttl) == (10 * 2**30, 1000, 30.0, 30.0)
    assert spec.band_for(0).max_requests == 100 and spec.band_for(0).fairness_ref == "rr"
    assert (spec.band_for(-3).max_requests, spec.band_for(-3).max_bytes) == (10, 2**20)
    assert spec.band_for(5).max_requests == DEFAULT_BAND_MAX_REQUESTS  # "0" is unset, not zero capacity
    assert isinstance(plan.policies.fairness["rr"], RoundRobinFairness)
    assert isinstance(plan.policies.ordering["edf-ordering-policy"], EdfOrdering)
    assert spec.band_starvation_limit == 0


def test_no_endpoint_ttl_set_on_its_own() -> None:
    loaded = load(PICKER + GATE + "flowControl: {defaultRequestTTL: 5s, noEndpointRequestTTL: 2m}\n")
    assert loaded.flow_control is not None
    assert (loaded.flow_control.spec.default_ttl, loaded.flow_control.spec.no_endpoint_ttl) == (5.0, 120.0)


@pytest.mark.parametrize(("section", "path", "message"), [
    ("{defaultPriorityBand: {fairnessPolicyRef: nope}}", "flowControl.defaultPriorityBand.fairnessPolicyRef",
     "plugin 'nope' not found"),
    ("{priorityBands: [{priority: 1, orderingPolicyRef: max-score-picker}]}",
     "flowControl.priorityBands[0].orderingPolicyRef", "is not a ordering policy"),
    ("{usageLimitPolicyPluginRef: missing}", "flowControl.usageLimitPolicyPluginRef", "plugin 'missing' not found"),
    ("{saturationDetector: {pluginRef: other}}", "flowControl.saturationDetector.pluginRef",
     "saturation detector references undefined plugin 'other'"),
    ("{priorityBands: [{priority: 1}, {priority: 1}]}", "flowControl.priorityBands[1].priority",
     "duplicate priority band 1"),
    ("{priorityBands: [{maxRequests: 3}]}", "flowControl.priorityBands[0].priority", "needs a priority"),
    ("{maxRequests: -5}", "flowControl.maxRequests", "non-negative"),
    ("{surprise: 1}", "flowControl.surprise", "unknown key"),
])
def test_errors_name_the_field(section: str, path: str, message: str) -> None:
    error = config_error(epp(PICKER + GATE + f"flowControl: {section}\n"))
    assert error.path == path and message in error.message


def test_gate_off_warns_and_runs_only_admitters_and_a_named_detector() -> None:
    loaded = load(PICKER + "flowControl: {maxRequests: 10}\n")
    assert loaded.flow_control is not None and not loaded.flow_control.enabled
    assert loaded.flow_control.detector is None and loaded.flow_control.policies is None
    assert any("feature gate is disabled" in w for w in loaded.warnings)
    legacy = load(PICKER + "flowControl: {saturationDetector: {pluginRef: utilization-detector}}\n")
    assert legacy.flow_control is not None and legacy.flow_control.detector is not None
    assert legacy.warnings == []


def test_enable_eviction_is_accepted_with_a_warning() -> None:
    loaded = load(PICKER + GATE + "flowControl: {enableEviction: true}\n")
    assert any("enableEviction" in w and "not implemented" in w for w in loaded.warnings)


def test_check_config_describes_flow_control() -> None:
    from ppc_extproc.config.describe import describe_config

    gated = describe_config(load(GATE + """\
plugins: [{type: max-score-picker}, {type: program-aware-fairness}]
flowControl: {defaultPriorityBand: {fairnessPolicyRef: program-aware-fairness}, bandStarvationLimit: 0}
"""))
    (line,) = [line for line in gated if line.startswith("flow control:")]
    assert "default band fairness program-aware-fairness, ordering fcfs-ordering-policy" in line
    assert "band starvation limit off (strict priority)" in line
    legacy = describe_config(load("plugins: [{type: max-score-picker}, {type: probabilistic-admitter}]\n"))
    assert "admitters: probabilistic-admitter" in legacy
    assert not any(line.startswith("flow control") for line in describe_config(load(PICKER)))
