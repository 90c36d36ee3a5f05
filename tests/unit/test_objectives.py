"""InferenceModelRewrite precedence and weighted split, InferenceObjective priorities."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from ppc_extproc.errors import ConfigError
from ppc_extproc.scheduling.objectives import (
    ModelRewrites,
    Objectives,
    ObjectParseError,
    load_objects,
    parse_model_rewrite,
    parse_objective,
)


def rewrite(name: str, created: str, rules: list[dict[str, Any]], pool: str = "qwen") -> dict[str, Any]:
    return {"metadata": {"name": name, "creationTimestamp": created}, "spec": {"poolRef": {"name": pool}, "rules": rules}}


def rule(targets: list[tuple[str, int]], *models: str) -> dict[str, Any]:
    return {"matches": [{"model": {"type": "Exact", "value": m}} for m in models],
            "targets": [{"modelRewrite": t, "weight": w} for t, w in targets]}


def table(*objs: dict[str, Any], rng: Any = None) -> ModelRewrites:
    rewrites = ModelRewrites(rng) if rng else ModelRewrites()
    rewrites.replace([r for obj in objs for r in parse_model_rewrite(obj, "qwen")])
    return rewrites


def test_exact_beats_generic_then_oldest_then_first_rule() -> None:
    generic = rewrite("a-generic", "2026-01-01T00:00:00Z", [rule([("base", 0)])])
    newer = rewrite("b-newer", "2026-03-01T00:00:00Z", [rule([("newer", 0)], "chat")])
    older = rewrite("c-older", "2026-02-01T00:00:00Z", [rule([("older", 0)], "chat"), rule([("second", 0)], "chat")])
    rewrites = table(generic, newer, older)
    assert rewrites.target("chat") == "older"
    assert rewrites.target("anything") == "base"
    assert table(newer).target("other") is None


def test_another_pools_rewrite_does_not_apply() -> None:
    assert not table(rewrite("x", "", [rule([("t", 0)], "chat")], pool="other"))


def test_weighted_split_follows_the_weights() -> None:
    draws = iter([i / 1000 for i in range(1000)])
    rewrites = table(rewrite("split", "", [rule([("a", 1), ("b", 3)], "chat")]), rng=lambda: next(draws))
    counts = Counter(rewrites.target("chat") for _ in range(1000))
    assert counts == {"a": 250, "b": 750}


def test_targets_without_weights_share_equally() -> None:
    draws = iter([0.1, 0.6])
    rewrites = table(rewrite("even", "", [rule([("a", 0), ("b", 0)], "chat")]), rng=lambda: next(draws))
    assert [rewrites.target("chat"), rewrites.target("chat")] == ["a", "b"]


@pytest.mark.parametrize(("bad", "field"), [
    ({"matches": [{"model": {"value": ""}}], "targets": [{"modelRewrite": "t"}]}, "spec.rules[0].matches[0].model.value"),
    ({"matches": [{"model": {"type": "Prefix", "value": "m"}}], "targets": [{"modelRewrite": "t"}]},
     "spec.rules[0].matches[0].model.type"),
    ({"targets": [{"modelRewrite": "t", "weight": -1}]}, "spec.rules[0].targets[0].weight"),
    ({"targets": [{"weight": 1}]}, "spec.rules[0].targets[0].modelRewrite"),
])
def test_an_invalid_rewrite_names_the_field(bad: dict[str, Any], field: str) -> None:
    with pytest.raises(ObjectParseError, match=field.replace("[", r"\[").replace("]", r"\]")):
        parse_model_rewrite(rewrite("bad", "", [bad]), "qwen")


def test_objective_priority_defaults_to_zero() -> None:
    objectives = Objectives()
    objectives.replace(dict(filter(None, [
        parse_objective({"metadata": {"name": "batch"}, "spec": {"poolRef": {"name": "qwen"}, "priority": -1}}, "qwen"),
        parse_objective({"metadata": {"name": "plain"}, "spec": {"poolRef": {"name": "qwen"}}}, "qwen"),
        parse_objective({"metadata": {"name": "elsewhere"}, "spec": {"poolRef": {"name": "x"}, "priority": 5}}, "qwen"),
    ])))
    assert [objectives.priority(n) for n in ("batch", "plain", "elsewhere", "", None)] == [-1, 0, 0, 0, 0]
    with pytest.raises(ObjectParseError, match="spec.priority"):
        parse_objective({"metadata": {"name": "x"}, "spec": {"priority": "high"}})


def test_the_file_form_loads_both_kinds(tmp_path: Path) -> None:
    path = tmp_path / "objects.yaml"
    path.write_text("""
kind: InferenceModelRewrite
metadata: {name: alias}
spec:
  poolRef: {name: any-pool}
  rules: [{matches: [{model: {value: assistant}}], targets: [{modelRewrite: qwen}]}]
---
kind: List
items:
- kind: InferenceObjective
  metadata: {name: batch}
  spec: {priority: -2}
""")
    rewrites, objectives = load_objects(str(path))
    assert rewrites.target("assistant") == "qwen" and objectives.priority("batch") == -2


def test_the_file_form_names_the_bad_object(tmp_path: Path) -> None:
    path = tmp_path / "objects.yaml"
    path.write_text("kind: InferenceObjective\nmetadata: {name: x}\nspec: {priority: high}\n---\nkind: Pod\n")
    with pytest.raises(ConfigError, match=r"--crd-file: .*object 0: spec.priority"):
        load_objects(str(path))
