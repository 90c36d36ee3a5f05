"""Kubernetes label selectors: parse ``--endpoint-selector``, match pod labels, render ``labelSelector``.

The syntax is the one ``kubectl -l`` and llm-d's ``--endpoint-selector`` accept
(``kubernetes/apimachinery: pkg/labels/selector.go`` ``Parse``): comma-separated requirements, each
``key=value``, ``key==value``, ``key!=value``, ``key in (a,b)``, ``key notin (a,b)``, ``key`` (exists)
or ``!key`` (does not exist). An empty selector matches everything. The numeric ``>``/``<``
operators are rejected with an error naming them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["LabelSelector", "Requirement", "SelectorError"]

# kubernetes/apimachinery: pkg/util/validation/validation.go (qualified names, label values).
_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_MAX_REQUIREMENTS = 64
_MAX_VALUES = 64


class SelectorError(ValueError):
    """A selector that does not parse; the message names the offending part."""


def _check_key(key: str) -> str:
    prefix, slash, name = key.rpartition("/")
    if not _NAME.match(name) or (slash and (not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix))):
        raise SelectorError(f"invalid label key {key!r}")
    return key


def _check_value(value: str) -> str:
    if value and not _NAME.match(value):
        raise SelectorError(f"invalid label value {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class Requirement:
    """One requirement: ``key``, an operator from ``in notin = != exists !``, and its values."""

    key: str
    operator: str
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        if self.operator == "exists":
            return present
        if self.operator == "!":
            return not present
        if self.operator in ("in", "="):
            return present and labels[self.key] in self.values
        # "!=" and "notin" match when the label is absent too (apimachinery semantics).
        return not present or labels[self.key] not in self.values

    def render(self) -> str:
        if self.operator == "exists":
            return self.key
        if self.operator == "!":
            return f"!{self.key}"
        if self.operator in ("=", "!="):
            return f"{self.key}{self.operator}{self.values[0]}"
        return f"{self.key} {self.operator} ({','.join(self.values)})"


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside ``( … )``."""
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
            if depth < 0:
                raise SelectorError("unbalanced ')'")
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    if depth:
        raise SelectorError("unbalanced '('")
    parts.append("".join(current))
    return parts


_SET_FORM = re.compile(r"^(?P<key>[^\s!=(),]+)\s+(?P<op>in|notin)\s*\((?P<values>[^()]*)\)$")
_EQ_FORM = re.compile(r"^(?P<key>[^\s!=(),]+)\s*(?P<op>==|=|!=)\s*(?P<value>[^\s!=(),]*)$")


def _parse_requirement(text: str) -> Requirement:
    item = text.strip()
    if not item:
        raise SelectorError("empty requirement")
    if match := _SET_FORM.match(item):
        values = tuple(sorted({_check_value(v.strip()) for v in match["values"].split(",")}))
        if values == ("",):
            raise SelectorError(f"{match['op']} needs at least one value: {item!r}")
        if len(values) > _MAX_VALUES:
            raise SelectorError(f"more than {_MAX_VALUES} values for {match['key']!r}")
        return Requirement(_check_key(match["key"]), match["op"], values)
    if match := _EQ_FORM.match(item):
        op = "=" if match["op"] == "==" else match["op"]
        return Requirement(_check_key(match["key"]), op, (_check_value(match["value"]),))
    if item.startswith("!"):
        return Requirement(_check_key(item[1:].strip()), "!")
    if ">" in item or "<" in item:
        raise SelectorError(f"the numeric operators > and < are not supported: {item!r}")
    if re.search(r"\s", item) or any(c in item for c in "=()"):
        raise SelectorError(f"cannot parse requirement {item!r}")
    return Requirement(_check_key(item), "exists")


@dataclass(frozen=True, slots=True)
class LabelSelector:
    """A conjunction of requirements, in canonical (sorted) order."""

    requirements: tuple[Requirement, ...] = ()

    @classmethod
    def parse(cls, text: str) -> LabelSelector:
        """Parse selector syntax; raises SelectorError naming the bad requirement."""
        if not text.strip():
            return cls()
        requirements = [_parse_requirement(part) for part in _split_top_level(text)]
        if len(requirements) > _MAX_REQUIREMENTS:
            raise SelectorError(f"more than {_MAX_REQUIREMENTS} requirements")
        return cls(tuple(sorted(set(requirements), key=lambda r: (r.key, r.operator, r.values))))

    @classmethod
    def from_match_labels(cls, match_labels: Mapping[str, str]) -> LabelSelector:
        """An equality selector (an InferencePool's ``spec.selector.matchLabels``)."""
        return cls(tuple(
            Requirement(_check_key(k), "=", (_check_value(v),)) for k, v in sorted(match_labels.items())
        ))

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(r.matches(labels) for r in self.requirements)

    def render(self) -> str:
        """The ``labelSelector`` query value (empty: everything)."""
        return ",".join(r.render() for r in self.requirements)

    def __str__(self) -> str:
        return self.render()
