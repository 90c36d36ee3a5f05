"""Is the machine the bottleneck? CPU use per process and the service's decision latency.

``CpuMeter`` reads ``/proc`` (Linux; elsewhere it reports nothing): the whole machine's busy
fraction and each watched process's CPU time over a run. ``decision_latency`` reads the
``ppc_extproc_decision_duration_seconds`` histogram from the admin ``/metrics`` of each service
replica and merges them.
"""

from __future__ import annotations

import math
import os
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

__all__ = [
    "CpuMeter", "CpuReport", "DecisionLatency", "decision_latency", "machine_info", "tree_cpu_seconds", "tree_rss_bytes",
]  # fmt: skip

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _machine_ticks() -> tuple[int, int] | None:
    """(busy, total) jiffies over all CPUs, or None without ``/proc/stat``."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def _process_seconds(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            rest = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(rest[11]) + int(rest[12])) / _TICKS  # utime + stime


def _process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants (``serve --workers`` runs its workers as children)."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return [pid]
    for entry in entries:
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    tree, todo = [], [pid]
    while todo:
        p = todo.pop()
        tree.append(p)
        todo.extend(children.get(p, []))
    return tree


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) of ``pid`` and its descendants; 0 without ``/proc``."""
    return sum(s for p in _process_tree(pid) if (s := _process_seconds(p)) is not None)


def tree_rss_bytes(pid: int) -> int:
    """Resident memory of ``pid`` and its descendants."""
    total = 0
    for p in _process_tree(pid):
        try:
            with open(f"/proc/{p}/status", encoding="ascii", errors="replace") as f:
                total += next((int(ln.split()[1]) * 1024 for ln in f if ln.startswith("VmRSS:")), 0)
        except OSError:
            pass
    return total


@dataclass(frozen=True, slots=True)
class CpuReport:
    """CPU use over an interval."""

    wall_s: float
    cpus: int
    #: Busy fraction of all CPUs (1.0 = every core busy the whole time); NaN if unknown.
    machine_busy: float
    #: Process name → average cores used.
    cores_by_process: dict[str, float] = field(default_factory=dict)


class CpuMeter:
    """``start(pids)`` … ``stop()`` → :class:`CpuReport`. This process is always watched."""

    def __init__(self) -> None:
        self._pids: dict[str, int] = {}
        self._t0 = 0.0
        self._machine0: tuple[int, int] | None = None
        self._proc0: dict[str, float] = {}

    def start(self, pids: Mapping[str, int | None]) -> None:
        self._pids = {name: pid for name, pid in pids.items() if pid is not None}
        self._pids.setdefault("load-generator", os.getpid())
        self._t0 = time.monotonic()
        self._machine0 = _machine_ticks()
        self._proc0 = {n: s for n, p in self._pids.items() if (s := _process_seconds(p)) is not None}

    def stop(self) -> CpuReport:
        wall = time.monotonic() - self._t0
        machine1 = _machine_ticks()
        busy = math.nan
        if self._machine0 is not None and machine1 is not None:
            d_total = machine1[1] - self._machine0[1]
            busy = (machine1[0] - self._machine0[0]) / d_total if d_total > 0 else math.nan
        cores: dict[str, float] = {}
        for name, pid in self._pids.items():
            now = _process_seconds(pid)
            if now is not None and name in self._proc0 and wall > 0:
                cores[name] = (now - self._proc0[name]) / wall
        return CpuReport(wall, os.cpu_count() or 1, busy, cores)


@dataclass(frozen=True, slots=True)
class DecisionLatency:
    """The service's routing decisions over a run (from its histogram; summed over replicas)."""

    count: int
    mean_s: float
    #: Upper bound of the histogram bucket holding the 99th percentile.
    p99_le_s: float
    #: Decisions per replica (admin URL order); one entry for a single service.
    per_replica: tuple[int, ...] = ()


@dataclass(slots=True)
class _Histogram:
    count: float = 0.0
    total: float = 0.0
    buckets: dict[float, float] = field(default_factory=dict)


def _read_histogram(admin_url: str, timeout_s: float) -> _Histogram | None:
    try:
        with urllib.request.urlopen(admin_url + "/metrics", timeout=timeout_s) as resp:
            text = resp.read().decode()
    except OSError:
        return None
    h = _Histogram()
    for family in text_string_to_metric_families(text):
        if family.name != "ppc_extproc_decision_duration_seconds":
            continue
        for sample in family.samples:
            if sample.name.endswith("_bucket"):
                le = float(sample.labels["le"])
                h.buckets[le] = h.buckets.get(le, 0.0) + sample.value
            elif sample.name.endswith("_count"):
                h.count += sample.value
            elif sample.name.endswith("_sum"):
                h.total += sample.value
    return h


def decision_latency(admin_urls: str | Sequence[str], timeout_s: float = 5.0) -> DecisionLatency | None:
    """Read ``ppc_extproc_decision_duration_seconds`` from each service's ``/metrics`` and merge
    the histograms (the buckets are the same everywhere); None if no service answered."""
    urls = [admin_urls] if isinstance(admin_urls, str) else list(admin_urls)
    read = [_read_histogram(u, timeout_s) for u in urls]
    found = [h for h in read if h is not None]
    if not found:
        return None
    per_replica = tuple(int(h.count) if h is not None else 0 for h in read)
    count = sum(h.count for h in found)
    if count <= 0:
        return DecisionLatency(0, math.nan, math.nan, per_replica)
    buckets: dict[float, float] = {}
    for h in found:
        for le, n in h.buckets.items():
            buckets[le] = buckets.get(le, 0.0) + n
    p99 = next((le for le, n in sorted(buckets.items()) if n >= 0.99 * count), math.inf)
    return DecisionLatency(int(count), sum(h.total for h in found) / count, p99, per_replica)


def machine_info() -> dict[str, str | int]:
    """What the numbers were measured on."""
    import platform

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cpus": os.cpu_count() or 1,
        "system": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
    }
