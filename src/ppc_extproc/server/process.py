"""Process-wide settings ``serve`` applies at start: the garbage collector's and the allocator's."""

from __future__ import annotations

import ctypes
import gc
import os
import sys

__all__ = ["configure_gc", "configure_malloc"]

_GC_GEN0_THRESHOLD = 50_000

#: ``mallopt`` parameters (glibc's ``malloc.h``).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
#: Buffers up to this size come from the heap: a 200K-token body is ~1.2 MB and its token array
#: is parsed into up to 2.5 MB.
MMAP_THRESHOLD_BYTES = 16 << 20
#: Freed heap kept for reuse before it is returned to the system.
TRIM_THRESHOLD_BYTES = 64 << 20
#: The environment variables with which glibc users set the same thresholds themselves.
_GLIBC_TUNABLES = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")


def configure_gc() -> None:
    """The KV-event path allocates many short-lived containers (decoded batches): collect the
    young generation less often, and keep everything built at startup out of later collections."""
    gc.set_threshold(_GC_GEN0_THRESHOLD, *gc.get_threshold()[1:])
    gc.freeze()


def configure_malloc() -> bool:
    """Serve a long prompt's buffers from reused heap instead of fresh pages; True when applied.

    With glibc's defaults a buffer over the mmap threshold (128 KB, raised only up to the size of
    the last one freed) is a new mapping, and every page of it faults on first touch: a 100K-token
    request (its gRPC message, body and token array) took ~100 page faults, the service's and
    grpc's threads allocating from arenas that are trimmed back after each request. Raising the
    mmap and trim thresholds keeps up to ``TRIM_THRESHOLD_BYTES`` of freed memory per arena for the
    next request. Skipped off glibc, and when the environment sets the thresholds itself."""
    if not sys.platform.startswith("linux") or any(name in os.environ for name in _GLIBC_TUNABLES):
        return False
    try:
        libc = ctypes.CDLL(None)  # the process's own symbols, the C library's among them
        mallopt = libc.mallopt
        libc.gnu_get_libc_version  # noqa: B018  # glibc only: musl has no mallopt thresholds
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))
