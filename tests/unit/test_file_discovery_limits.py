"""file-discovery reads a bounded regular file (issue #11 F11: ``/dev/zero`` reached 2.3 GB)."""

from __future__ import annotations

import os
import resource
from pathlib import Path

import pytest

from ppc_extproc.discovery.file import MAX_FILE_BYTES, FileDiscovery, read_endpoints_file
from ppc_extproc.errors import ConfigError


def _max_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="needs /dev/zero")
def test_a_device_is_refused_without_being_read() -> None:
    before = _max_rss_bytes()
    with pytest.raises(ConfigError) as info:
        FileDiscovery("file-discovery", "/dev/zero").load()
    assert "not a regular file" in str(info.value)
    assert _max_rss_bytes() - before < 64 * 1024 * 1024


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path: Path) -> None:
    fifo = tmp_path / "endpoints.yaml"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="not a regular file"):
        read_endpoints_file(fifo)


def test_a_file_beyond_the_bound_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "endpoints.yaml"
    entry = b"- {address: 10.0.0.1, port: 8000}\n"
    path.write_bytes(entry + b"#" * (MAX_FILE_BYTES - len(entry)) + b"\n")
    with pytest.raises(ConfigError, match=f"larger than {MAX_FILE_BYTES} bytes"):
        FileDiscovery("file-discovery", str(path)).load()
    path.write_bytes(entry + b"#" * (MAX_FILE_BYTES - len(entry) - 1) + b"\n")  # exactly the bound
    endpoints = FileDiscovery("file-discovery", str(path)).load()
    assert endpoints is not None and [e.id for e in endpoints] == ["10.0.0.1:8000"]


def test_a_file_that_is_not_utf8_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "endpoints.yaml"
    path.write_bytes(b"- {address: 10.0.0.1, port: 8000, name: \xff}\n")
    with pytest.raises(ConfigError) as info:
        read_endpoints_file(path)
    assert info.value.path == str(path) and "not UTF-8" in info.value.message
