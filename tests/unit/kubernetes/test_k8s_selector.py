"""Label selectors: llm-d's --endpoint-selector syntax, apimachinery's matching semantics."""

from __future__ import annotations

import pytest

from ppc_extproc.discovery.kubernetes.selector import LabelSelector, SelectorError


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("app=vllm,env=prod", "app=vllm,env=prod"),
        ("env=prod, app==vllm", "app=vllm,env=prod"),
        ("env in (prod,staging),tier!=frontend", "env in (prod,staging),tier!=frontend"),
        ("env notin ( b , a )", "env notin (a,b)"),
        ("key,!deprecated", "!deprecated,key"),
        ("llm-d.ai/role=decode", "llm-d.ai/role=decode"),
        ("app=", "app="),
        ("", ""),
    ],
)
def test_parse_renders_canonically(text: str, canonical: str) -> None:
    assert LabelSelector.parse(text).render() == canonical


@pytest.mark.parametrize(
    ("text", "labels", "expected"),
    [
        ("app=vllm", {"app": "vllm"}, True),
        ("app=vllm", {"app": "sglang"}, False),
        ("app=vllm", {}, False),
        ("tier!=frontend", {}, True),  # != and notin match an absent label (apimachinery)
        ("tier!=frontend", {"tier": "frontend"}, False),
        ("env in (a,b)", {"env": "b"}, True),
        ("env in (a,b)", {}, False),
        ("env notin (a,b)", {}, True),
        ("env notin (a,b)", {"env": "a"}, False),
        ("gpu", {"gpu": ""}, True),
        ("gpu", {}, False),
        ("!gpu", {}, True),
        ("!gpu", {"gpu": "x"}, False),
        ("app=vllm,!gpu", {"app": "vllm", "gpu": "1"}, False),
        ("", {"anything": "x"}, True),
    ],
)
def test_matching(text: str, labels: dict[str, str], expected: bool) -> None:
    assert LabelSelector.parse(text).matches(labels) is expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("replicas>2", "numeric operators"),
        ("env in (a,b", "unbalanced"),
        ("env in a,b)", "unbalanced"),
        ("env in ()", "needs at least one value"),
        ("-bad=x", "invalid label key"),
        ("app=has space", "cannot parse"),
        ("app=vllm,,env=x", "empty requirement"),
        ("UPPER.example.com/app=x", "invalid label key"),
        ("app=" + "v" * 64, "invalid label value"),
    ],
)
def test_errors_name_the_requirement(text: str, message: str) -> None:
    with pytest.raises(SelectorError, match=message):
        LabelSelector.parse(text)


def test_from_match_labels_is_an_equality_selector() -> None:
    selector = LabelSelector.from_match_labels({"b": "2", "a": "1"})
    assert selector.render() == "a=1,b=2"
    assert selector == LabelSelector.parse("b=2,a=1")
    assert selector.matches({"a": "1", "b": "2", "c": "3"}) and not selector.matches({"a": "1"})
