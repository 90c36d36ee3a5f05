from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
import structlog

from ppc_extproc.discovery import FileDiscovery, parse_endpoints_document
from ppc_extproc.errors import ConfigError
from ppc_extproc.framework import EndpointEventKind
from ppc_extproc.scheduling.pool import EndpointPool


def test_parse_list_and_mapping_forms() -> None:
    listed = parse_endpoints_document("- {name: a, address: 10.0.0.1, port: 8000}\n- {address: 10.0.0.2, port: '8001', rank: 1, labels: {zone: b}}")
    assert [(e.id, e.rank, e.labels) for e in listed] == [("10.0.0.1:8000", 0, ()), ("10.0.0.2:8001", 1, (("zone", "b"),))]
    mapped = parse_endpoints_document("endpoints:\n- {address: 'fd00::1', port: 8000, namespace: default}")
    assert mapped[0].id == "fd00::1:8000"
    assert parse_endpoints_document("") == []


@pytest.mark.parametrize(
    ("text", "path", "message"),
    [
        ("- {address: vllm-0, port: 8000}", "[0].address", "expected an IP address"),
        ("- {address: 10.0.0.1, port: http}", "[0].port", "expected a port number"),
        ("- {address: 10.0.0.1, port: 70000}", "[0].port", "out of range"),
        ("- {address: 10.0.0.1, port: 1, extra: 2}", "[0].extra", "unknown key"),
        ("- {address: 10.0.0.1, port: 1}\n- {address: 10.0.0.1, port: 1}", "[1]", "duplicate endpoint"),
    ],
)
def test_bad_entries_name_the_field(text: str, path: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_endpoints_document(text)
    assert info.value.path == path and message in info.value.message


def _touch(path: Path, text: str, bump: int) -> None:
    path.write_text(text)
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + bump * 1_000_000_000))


def test_watched_file_emits_add_update_delete_and_survives_a_broken_edit(tmp_path: Path) -> None:
    path = tmp_path / "endpoints.yaml"
    _touch(path, "- {address: 10.0.0.1, port: 8000}\n- {address: 10.0.0.2, port: 8000}", 0)
    pool = EndpointPool()
    events = []
    pool.subscribe(events.append)
    discovery = FileDiscovery("file-discovery", str(path), poll_interval_seconds=0.01, watch=True)

    async def scenario() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(discovery.run(pool, stop))

        async def until(predicate) -> None:
            for _ in range(500):
                if predicate():
                    return
                await asyncio.sleep(0.01)
            raise AssertionError("condition not met")

        await until(lambda: len(pool) == 2)
        _touch(path, "- {address: 10.0.0.2, port: 8000, rank: 1}\n- {address: 10.0.0.3, port: 8000}", 1)
        await until(lambda: {e.id for e in pool.endpoints()} == {"10.0.0.2:8000", "10.0.0.3:8000"})
        with structlog.testing.capture_logs() as logs:
            _touch(path, "- {address: not-an-ip, port: 1}", 2)  # broken: the previous list stays
            await until(lambda: any(e["event"] == "discovery_file_invalid" for e in logs))
        assert len(pool) == 2
        _touch(path, "- {address: 10.0.0.3, port: 8000}", 3)
        await until(lambda: len(pool) == 1)
        stop.set()
        await task

    asyncio.run(scenario())
    kinds = [(e.kind, e.endpoint.id) for e in events]
    assert (EndpointEventKind.DELETED, "10.0.0.1:8000") in kinds
    assert (EndpointEventKind.UPDATED, "10.0.0.2:8000") in kinds
    assert (EndpointEventKind.ADDED, "10.0.0.3:8000") in kinds
    assert kinds[-1] == (EndpointEventKind.DELETED, "10.0.0.2:8000")


def test_unreadable_file_fails_startup(tmp_path: Path) -> None:
    discovery = FileDiscovery("file-discovery", str(tmp_path / "missing.yaml"))
    with pytest.raises(ConfigError, match="cannot read"):
        asyncio.run(discovery.run(EndpointPool(), asyncio.Event()))
