"""Helpers shared by the benchmark scripts: machine description, timing, percentiles."""

from __future__ import annotations

import os
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Callable

__all__ = ["header", "percentile", "pin_to_one_core", "time_calls"]


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def header(title: str) -> None:
    """Print what was run, where, and with which Python."""
    print(f"# {title}")
    print(f"command: {shlex.join([sys.executable.rsplit('/', 1)[-1], *sys.argv])}")
    print(f"machine: {_cpu_model()}, {os.cpu_count()} cores, {platform.system()} {platform.release()}")
    print(f"python:  {platform.python_version()} ({platform.python_implementation()})")
    print()


def pin_to_one_core() -> None:
    """Measure on one core, as the targets are stated."""
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


def time_calls(fn: Callable[[], object], repeat: int, warmup: int = 3) -> list[float]:
    """Seconds per call, ``repeat`` samples after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return samples


def ms(samples: list[float]) -> str:
    return f"p50 {statistics.median(samples) * 1e3:7.3f} ms  p99 {percentile(samples, 99) * 1e3:7.3f} ms"
