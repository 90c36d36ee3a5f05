"""One parser behaviour at every body size: the simdjson fast path and the streaming extractor
give exactly what the orjson reference gives — the same parse, or the same 400 naming the same
field — and never anything else (an exception other than ``BadRequestError`` is a 500)."""

from __future__ import annotations

from typing import Any

import fault_tally as tally
from fault_bodies import FAST, SMALL, STREAMED, positionless, reference, request_bodies, run, sized, streamed
from hypothesis import given

from ppc_extproc.tokens import parse_body


@tally.campaign(300)
@given(request_bodies())
def test_every_path_parses_a_body_exactly_as_the_reference(case: tuple[str, bytes]) -> None:
    path, raw = case
    by_size: dict[int, tuple[Any, ...]] = {}
    for size in (SMALL, FAST, STREAMED):
        body = sized(raw, size)
        expected = run(reference, path, body)
        assert run(parse_body, path, body) == expected, f"fast path, {len(body)} bytes"
        assert run(streamed, path, body) == expected, f"streamed, {len(body)} bytes"
        by_size[size] = positionless(expected)
        tally.add("parser: bodies, each in 3 size classes")
        if expected[0] == "error":
            tally.add("parser: malformed, same 400 on every path")
    if raw.strip():  # an empty body and a blank one are different documents
        assert by_size[SMALL] == by_size[FAST] == by_size[STREAMED]
