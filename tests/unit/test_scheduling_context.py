"""Per-endpoint data on a scheduling context: one value per (key, endpoint), read one at a time
or as a whole column, and the best match info across producers."""

from __future__ import annotations

import pytest

from ppc_extproc.framework import PREFIX_CACHE_MATCH_INFO, LLMRequest, SchedulingContext
from ppc_extproc.framework.datakeys import DataKey, DataType
from ppc_extproc.ids import EndpointId
from ppc_extproc.matchinfo import PrefixCacheMatchInfo

A, B, C = EndpointId("10.0.0.1:8000"), EndpointId("10.0.0.2:8000"), EndpointId("10.0.0.3:8000")
TOPOLOGY: DataKey[str] = DataType("Topology").of("producer")


def _ctx() -> SchedulingContext:
    return SchedulingContext(LLMRequest("r", "m"), [])


def test_values_are_read_one_at_a_time_or_as_a_column() -> None:
    ctx = _ctx()
    assert ctx.endpoint_value(A, TOPOLOGY) is None and dict(ctx.endpoint_values(TOPOLOGY)) == {}
    ctx.put_endpoint_value(A, TOPOLOGY, "rack-1")
    ctx.put_endpoint_values(TOPOLOGY, {B: "rack-2", A: "rack-3"})  # merged: A replaced, B added
    assert ctx.endpoint_value(A, TOPOLOGY) == "rack-3" and ctx.endpoint_value(C, TOPOLOGY) is None
    assert dict(ctx.endpoint_values(TOPOLOGY)) == {A: "rack-3", B: "rack-2"}


def test_an_absent_column_cannot_be_written_through() -> None:
    with pytest.raises(TypeError):
        _ctx().endpoint_values(TOPOLOGY)[A] = "x"  # type: ignore[index]


def test_match_info_without_a_key_is_the_longest_any_producer_wrote() -> None:
    ctx = _ctx()
    short, long = PrefixCacheMatchInfo(2, 10, 16, 2), PrefixCacheMatchInfo(7, 10, 16, 7)
    ctx.put_endpoint_value(A, TOPOLOGY, "rack-1")  # not a match info: never chosen
    ctx.put_endpoint_values(PREFIX_CACHE_MATCH_INFO.of("approx"), {A: short, B: short})
    ctx.put_endpoint_values(PREFIX_CACHE_MATCH_INFO.of("precise"), {A: long})
    assert ctx.match_info(A) is long and ctx.match_info(B) is short and ctx.match_info(C) is None
    assert ctx.match_info(A, PREFIX_CACHE_MATCH_INFO.of("approx")) is short
    assert ctx.uncached_tokens(C) == 0
