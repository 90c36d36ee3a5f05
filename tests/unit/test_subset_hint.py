"""Subset hints name pods by IP, the port stripped (llm-d ``requestcontrol/candidates.go`` ``Locate``)."""

from __future__ import annotations

import pytest

from ppc_extproc.framework import Endpoint
from ppc_extproc.scheduling.pool import EndpointPool


@pytest.fixture
def pool() -> EndpointPool:
    pool = EndpointPool()
    pool.replace(
        [Endpoint("10.0.0.1", 8000), Endpoint("10.0.0.1", 8001), Endpoint("10.0.0.2", 8000), Endpoint("fd00::1", 8000)]
    )
    return pool


@pytest.mark.parametrize(
    ("subset", "expected"),
    [
        (["10.0.0.1:9999"], {"10.0.0.1:8000", "10.0.0.1:8001"}),  # the port is not compared
        (["10.0.0.1:8000"], {"10.0.0.1:8000", "10.0.0.1:8001"}),  # every rank of the pod
        (["10.0.0.2"], {"10.0.0.2:8000"}),
        (["10.0.0.1:1,10.0.0.2:2"], {"10.0.0.1:8000", "10.0.0.1:8001", "10.0.0.2:8000"}),
        (["[fd00::1]:9"], {"fd00::1:8000"}),
        (["fd00::1"], {"fd00::1:8000"}),
        (["10.0.0.9:8000"], set()),
        ([], set()),
    ],
)
def test_subset_hint_matches_by_ip(pool: EndpointPool, subset: list[str], expected: set[str]) -> None:
    assert {e.id for e in pool.candidates(subset)} == expected


def test_no_hint_is_every_endpoint(pool: EndpointPool) -> None:
    assert len(pool.candidates(None)) == 4
