"""Helpers shared by the benchmark scripts: machine description, timing, percentiles."""

from __future__ import annotations

import importlib.util
import os
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

__all__ = ["WRK_SCRIPT", "grpclib_extproc", "header", "percentile", "pin_to_one_core", "run_wrk", "time_calls"]

#: wrk Lua script: POST the body file, print one ``RESULT {json}`` line (requests, seconds, errors,
#: non-2xx, latency p50/p90/p99 in µs). Format with ``body=<path>``.
WRK_SCRIPT = """
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = io.open("{body}", "r"):read("*a")
done = function(summary, latency, requests)
  io.write(string.format("RESULT {{\\"requests\\": %d, \\"seconds\\": %f, \\"errors\\": %d, \\"non2xx\\": %d, \\"p50\\": %d, \\"p90\\": %d, \\"p99\\": %d}}\\n",
    summary.requests, summary.duration / 1e6, summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    summary.errors.status, latency:percentile(50), latency:percentile(90), latency:percentile(99)))
end
"""


def run_wrk(url: str, script: object, connections: int, seconds: float) -> dict[str, float]:
    """Run ``wrk`` with ``script`` (a file written from :data:`WRK_SCRIPT`); its RESULT plus ``rps``."""
    import json
    import re
    import subprocess

    out = subprocess.run(
        ["wrk", f"-t{min(2, connections)}", f"-c{connections}", f"-d{max(1, round(seconds))}s", "--timeout", "10s",
         "-s", str(script), url],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    match = re.search(r"RESULT (\{.*\})", out)
    if match is None:
        raise RuntimeError(f"wrk printed no result:\n{out}")
    result: dict[str, float] = json.loads(match.group(1))
    result["rps"] = result["requests"] / result["seconds"]
    return result


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


def grpclib_extproc() -> Path | None:
    """The trivial ext_proc on grpclib (``_grpclib_extproc.py``), or None without the ``bench`` extra."""
    return Path(__file__).resolve().parent / "_grpclib_extproc.py" if importlib.util.find_spec("grpclib") else None
