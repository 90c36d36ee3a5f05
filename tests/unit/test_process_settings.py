"""``configure_malloc``: a long prompt's buffers come from reused heap, not fresh pages."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

# Allocates and drops a body-sized buffer and a copy of it per "request", as the request path does,
# and prints the page faults per request after a warm-up (minor faults: first touches of fresh pages).
_REQUESTS = """
import resource, sys
from ppc_extproc.server.process import configure_malloc
applied = configure_malloc() if sys.argv[1] == "tuned" else None
kept = []
def request():
    body = b"x" * 400_000
    copy = bytearray(body)
    kept.append(b"y" * 100)  # something small outlives each request
    del body, copy
for _ in range(10):
    request()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(100):
    request()
print(applied, (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 100)
"""

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or os.environ.get("LD_PRELOAD"),
                                reason="glibc's allocator on Linux")  # fmt: skip


def _faults_per_request(mode: str, **env: str) -> tuple[str, float]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    out = subprocess.run([sys.executable, "-c", _REQUESTS, mode], capture_output=True, text=True, check=True,
                         timeout=60, env={**clean, **env}).stdout.split()  # fmt: skip
    return out[0], float(out[1])


def test_glibc_defaults_fault_every_page_of_each_large_buffer() -> None:
    applied, faults = _faults_per_request("default")
    assert applied == "None"
    assert faults > 50  # ~100 pages of the body and ~100 of its copy, each request


def test_configured_thresholds_reuse_the_freed_heap() -> None:
    applied, faults = _faults_per_request("tuned")
    assert applied == "True"
    assert faults < 5


def test_thresholds_set_in_the_environment_win() -> None:
    applied, faults = _faults_per_request("tuned", MALLOC_MMAP_THRESHOLD_="131072", MALLOC_TRIM_THRESHOLD_="131072")
    assert applied == "False"  # left as the environment set them: faults come back
    assert faults > 50
