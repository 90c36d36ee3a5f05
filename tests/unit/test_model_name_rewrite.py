"""The response's model name back to the client's (llm-d ``handlers/server.go`` ``rewriteModelName``)."""

from __future__ import annotations

import pytest

from ppc_extproc.server.model_name import ModelNameRewriter


def test_json_body_with_and_without_a_space() -> None:
    rewriter = ModelNameRewriter("served-model", "alias")
    body = b'{"id":"x","model":"served-model","choices":[{"text":"model served-model"}],"m": {"model": "served-model"}}'
    assert rewriter.feed(body, True) == (
        b'{"id":"x","model":"alias","choices":[{"text":"model served-model"}],"m": {"model": "alias"}}'
    )
    assert rewriter.length_changes


@pytest.mark.parametrize("cut", range(1, 40))
def test_a_pattern_split_between_chunks_is_still_rewritten(cut: int) -> None:
    rewriter = ModelNameRewriter("served-model", "a")
    event = b'data: {"id":"1","model":"served-model","x":1}\n\n'
    out = rewriter.feed(event[:cut], False) + rewriter.feed(event[cut:], False)
    assert out == b'data: {"id":"1","model":"a","x":1}\n\n'


def test_an_event_end_is_never_held_back() -> None:
    rewriter = ModelNameRewriter("served-model", "a")
    event = b'data: {"model":"served-model"}\n\n'
    assert rewriter.feed(event, False) == b'data: {"model":"a"}\n\n'


def test_names_are_json_encoded() -> None:
    rewriter = ModelNameRewriter('m"1', "a")
    assert rewriter.feed(b'{"model":"m\\"1"}', True) == b'{"model":"a"}'
    assert not ModelNameRewriter("abc", "xyz").length_changes
