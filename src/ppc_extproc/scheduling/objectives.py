"""InferenceModelRewrite and InferenceObjective as the request path reads them.

``InferenceModelRewrite`` (GIE ``apix/v1alpha2``, served by llm-d as ``llm-d.ai/v1alpha2`` or the
legacy ``inference.networking.x-k8s.io/v1alpha2``): ``spec.poolRef``, ``spec.rules[]`` each with
``matches[].model {type: Exact, value}`` (empty: every model) and ``targets[] {modelRewrite,
weight}``. Precedence across every rewrite of the pool, as the type's documentation states: an
exact match beats a generic rule; ties go to the oldest resource (``creationTimestamp``), then to
the first rule in the resource. Traffic splits over the targets by ``weight`` / sum of weights;
with no weights set the targets share equally.

``InferenceObjective``: ``spec.priority`` (default 0) and ``spec.poolRef``; a request names one by
``metadata.name`` in a header (``OBJECTIVE_HEADERS``).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ppc_extproc.errors import ConfigError

__all__ = [
    "OBJECTIVE_HEADERS",
    "ModelRewrites",
    "ObjectParseError",
    "Objectives",
    "RewriteRule",
    "load_objects",
    "parse_model_rewrite",
    "parse_objective",
]

#: The headers naming a request's InferenceObjective (llm-d's name first, then GIE's).
OBJECTIVE_HEADERS = ("x-llm-d-inference-objective", "x-gateway-inference-objective")


class ObjectParseError(ValueError):
    """A CRD object that cannot be used; the message names the field."""


@dataclass(frozen=True, slots=True)
class RewriteRule:
    """One rule: the exact models it matches (empty: all), its weighted targets, its precedence."""

    models: tuple[str, ...]
    targets: tuple[tuple[str, int], ...]
    #: (creationTimestamp, resource name, rule index): lower wins a tie.
    order: tuple[str, str, int]


def _pool_matches(spec: Mapping[str, Any], pool_name: str) -> bool:
    ref = spec.get("poolRef")
    return not pool_name or (isinstance(ref, Mapping) and ref.get("name") == pool_name)


def parse_model_rewrite(obj: Mapping[str, Any], pool_name: str = "") -> list[RewriteRule]:
    """The rules of one InferenceModelRewrite for ``pool_name`` (none for another pool)."""
    metadata = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    if not isinstance(spec, Mapping) or not _pool_matches(spec, pool_name):
        return []
    name, created = str(metadata.get("name") or ""), str(metadata.get("creationTimestamp") or "")
    rules = spec.get("rules") or []
    if not isinstance(rules, list):
        raise ObjectParseError("spec.rules: expected a list")
    out = []
    for i, rule in enumerate(rules):
        where = f"spec.rules[{i}]"
        if not isinstance(rule, Mapping):
            raise ObjectParseError(f"{where}: expected an object")
        models = []
        for j, match in enumerate(rule.get("matches") or []):
            model = match.get("model") if isinstance(match, Mapping) else None
            if not isinstance(model, Mapping) or not isinstance(model.get("value"), str) or not model["value"]:
                raise ObjectParseError(f"{where}.matches[{j}].model.value: expected a model name")
            if model.get("type", "Exact") != "Exact":
                raise ObjectParseError(f"{where}.matches[{j}].model.type: only Exact is supported")
            models.append(model["value"])
        targets = []
        for j, target in enumerate(rule.get("targets") or []):
            if not isinstance(target, Mapping) or not isinstance(target.get("modelRewrite"), str) or not target["modelRewrite"]:
                raise ObjectParseError(f"{where}.targets[{j}].modelRewrite: expected a model name")
            weight = target.get("weight", 0) or 0
            if not isinstance(weight, int) or not 0 <= weight <= 1_000_000:
                raise ObjectParseError(f"{where}.targets[{j}].weight: expected an integer in [1, 1000000]")
            targets.append((target["modelRewrite"], weight))
        if targets:
            out.append(RewriteRule(tuple(models), tuple(targets), (created, name, i)))
    return out


class ModelRewrites:
    """The pool's rewrite rules, replaced as a whole when any rewrite changes."""

    def __init__(self, rng: Callable[[], float] = random.random) -> None:
        self._rng = rng
        self._exact: dict[str, RewriteRule] = {}
        self._generic: RewriteRule | None = None

    def __bool__(self) -> bool:
        return bool(self._exact) or self._generic is not None

    def replace(self, rules: Iterable[RewriteRule]) -> None:
        exact: dict[str, RewriteRule] = {}
        generic: RewriteRule | None = None
        for rule in sorted(rules, key=lambda r: r.order):
            if not rule.models:
                generic = generic or rule
            for model in rule.models:
                exact.setdefault(model, rule)
        self._exact, self._generic = exact, generic

    def target(self, model: str) -> str | None:
        """The model to route ``model`` as (a weighted draw), or None when no rule matches."""
        rule = self._exact.get(model) or self._generic
        if rule is None:
            return None
        targets = rule.targets
        if len(targets) == 1:
            return targets[0][0]
        weights = [w for _, w in targets] if all(w > 0 for _, w in targets) else [1] * len(targets)
        draw = self._rng() * sum(weights)
        for (name, _), weight in zip(targets, weights, strict=True):
            draw -= weight
            if draw < 0:
                return name
        return targets[-1][0]


def parse_objective(obj: Mapping[str, Any], pool_name: str = "") -> tuple[str, int] | None:
    """(name, priority) of one InferenceObjective for ``pool_name`` (None for another pool)."""
    metadata = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    if not isinstance(spec, Mapping) or not _pool_matches(spec, pool_name):
        return None
    priority = spec.get("priority", 0)
    if priority is None:
        priority = 0
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise ObjectParseError("spec.priority: expected an integer")
    return str(metadata.get("name") or ""), priority


class Objectives:
    """InferenceObjective name → priority; an unknown or absent objective has priority 0."""

    def __init__(self) -> None:
        self._priorities: dict[str, int] = {}

    def replace(self, priorities: Mapping[str, int]) -> None:
        self._priorities = dict(priorities)

    def priority(self, name: str | None) -> int:
        return self._priorities.get(name, 0) if name else 0


def load_objects(path: str, flag: str = "--crd-file") -> tuple[ModelRewrites, Objectives]:
    """InferenceModelRewrite and InferenceObjective objects from a YAML file (several documents,
    or a ``kind: List``), for running without Kubernetes; every object applies (no pool filter)."""
    try:
        documents = [d for d in yaml.safe_load_all(Path(path).read_text()) if d is not None]
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(flag, f"cannot read {path}: {exc}") from None
    items: list[Any] = []
    for document in documents:
        if isinstance(document, Mapping) and document.get("kind") == "List":
            items.extend(document.get("items") or [])
        else:
            items.append(document)
    rules: list[RewriteRule] = []
    priorities: dict[str, int] = {}
    for i, obj in enumerate(items):
        kind = obj.get("kind") if isinstance(obj, Mapping) else None
        try:
            if kind == "InferenceModelRewrite":
                rules.extend(parse_model_rewrite(obj))
            elif kind == "InferenceObjective":
                entry = parse_objective(obj)
                if entry is not None:
                    priorities[entry[0]] = entry[1]
            else:
                raise ObjectParseError(f"kind: expected InferenceModelRewrite or InferenceObjective, got {kind!r}")
        except ObjectParseError as exc:
            raise ConfigError(flag, f"{path}: object {i}: {exc}") from None
    rewrites, objectives = ModelRewrites(), Objectives()
    rewrites.replace(rules)
    objectives.replace(priorities)
    return rewrites, objectives
