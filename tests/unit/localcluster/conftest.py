"""Fixtures for the local-cluster tests: stand-ins for the service and the mock engine."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ppc_extproc_lab.localcluster import LocalCluster

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
STUB_ENGINE = [sys.executable, str(HERE / "stub_engine.py")]
STUB_SERVICE = [sys.executable, str(HERE / "stub_extproc.py")]


@pytest.fixture
def stub_engine_command() -> list[str]:
    """Command prefix of the stand-in mock engine."""
    return list(STUB_ENGINE)


@pytest.fixture
def stub_service_command() -> list[str]:
    """Command prefix of the stand-in endpoint picker."""
    return list(STUB_SERVICE)


@pytest.fixture
def stub_cluster(tmp_path: Path) -> Iterator[Callable[..., LocalCluster]]:
    """Factory: a started ``LocalCluster`` running the stubs; every cluster is stopped at teardown."""
    clusters: list[LocalCluster] = []

    def make(**kwargs: Any) -> LocalCluster:
        kwargs.setdefault("engine_command", STUB_ENGINE)
        kwargs.setdefault("service_command", STUB_SERVICE)
        kwargs.setdefault("log_dir", tmp_path / f"cluster-{len(clusters)}")
        kwargs.setdefault("startup_timeout", 30.0)
        cluster = LocalCluster(**kwargs)
        clusters.append(cluster)
        cluster.start()
        return cluster

    try:
        yield make
    finally:
        for cluster in reversed(clusters):
            cluster.stop()
