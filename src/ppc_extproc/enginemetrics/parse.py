"""A small parser for the few vLLM gauges routing needs, from Prometheus text exposition.

Only samples of these families are read (exact names: ``vllm:num_requests_waiting_by_reason`` is
not ``vllm:num_requests_waiting``):

    vllm:num_requests_waiting   summed over series (one series per engine of the endpoint)
    vllm:num_requests_running   summed
    vllm:kv_cache_usage_perc    max over series; older vLLM (< 0.10): vllm:gpu_cache_usage_perc
    vllm:cache_config_info      labels block_size, num_gpu_blocks (first series)

The first sample of a family is located with ``bytes.find`` of ``"\\n<family>"`` (comment lines
start with ``#``); the exposition format keeps a family's samples in one group, so the following
lines are read until the group ends. One anchored regex match per sample, no per-line Python work
over the rest of the body and no decoding: a full vLLM exposition (~40 KB per engine) parses in a
few tens of microseconds, ~100× less than ``prometheus_client.parser``
(``tests/unit/test_engine_metrics_parse.py`` measures both).
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterator

from ppc_extproc.enginemetrics.types import EngineMetrics

__all__ = ["WANTED_FAMILIES", "parse_labels", "parse_vllm_metrics"]

WANTED_FAMILIES = (
    "vllm:num_requests_waiting",
    "vllm:num_requests_running",
    "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc",
    "vllm:cache_config_info",
)
_OLD_KV = "vllm:gpu_cache_usage_perc"

# The rest of a sample line after the family name: optional {labels} (quoted values may hold any
# character but an unescaped quote), blanks, the value. A name followed by anything else (e.g.
# "_by_reason") does not match.
_SAMPLE = re.compile(rb'(?:\{((?:[^"}\n]+|"[^"\\\n]*(?:\\.[^"\\\n]*)*")*)\})?[ \t]+(\S+)')
_NEEDLES = tuple((name, name.encode()) for name in WANTED_FAMILIES)
_LABEL = re.compile(rb'([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\\n]|\\.)*)"')


def parse_labels(text: bytes) -> dict[str, str]:
    """``a="1",b="x"`` → ``{"a": "1", "b": "x"}`` (escapes ``\\"``, ``\\\\``, ``\\n`` undone)."""
    out = {}
    for key, value in _LABEL.findall(text):
        v = value.decode("utf-8", "replace")
        if "\\" in v:
            v = v.replace("\\n", "\n").replace('\\"', '"').replace("\\\\", "\\")
        out[key.decode("ascii")] = v
    return out


def _int_label(labels: dict[str, str], key: str) -> int | None:
    try:
        value = int(float(labels.get(key, "")))
    except ValueError:  # missing, or "None" before vLLM has profiled the cache
        return None
    return value if value > 0 else None


@functools.lru_cache(maxsize=128)
def _cache_config(labels: bytes) -> tuple[int | None, int | None]:
    """(block_size, num_gpu_blocks); the label set rarely changes, so parse each one once."""
    parsed = parse_labels(labels)
    return _int_label(parsed, "block_size"), _int_label(parsed, "num_gpu_blocks")


def _float(raw: bytes) -> float | None:
    try:
        value = float(raw)
    except ValueError:
        return None
    return None if math.isnan(value) else value


def _family(data: bytes, name: bytes) -> Iterator[tuple[bytes, bytes]]:
    """(raw labels, raw value) of the sample lines of one family."""
    if data.startswith(name):
        line = 0
    else:
        line = data.find(b"\n" + name) + 1  # 0: not found
        if line == 0:
            return
    size = len(name)
    while True:
        match = _SAMPLE.match(data, line + size)
        if match is None:
            return
        yield match.group(1) or b"", match.group(2)
        line = data.find(b"\n", match.end()) + 1
        if line == 0 or not data.startswith(name, line):
            return


def parse_vllm_metrics(body: bytes | str, updated_at: float = 0.0) -> EngineMetrics:
    """The gauges of one ``/metrics`` body. Families the body lacks come back as None."""
    data = body.encode() if isinstance(body, str) else body
    sums: dict[str, float] = {}
    block_size: int | None = None
    num_blocks: int | None = None
    for name, raw_name in _NEEDLES:
        if name == _OLD_KV and "vllm:kv_cache_usage_perc" in sums:
            continue
        for labels, raw in _family(data, raw_name):
            if name == "vllm:cache_config_info":
                block_size, num_blocks = _cache_config(labels)
                break
            value = _float(raw)
            if value is None:
                continue
            if name.endswith("_perc"):
                sums[name] = max(sums.get(name, value), value)
            else:
                sums[name] = sums.get(name, 0.0) + value
    waiting = sums.get("vllm:num_requests_waiting")
    running = sums.get("vllm:num_requests_running")
    kv = sums.get("vllm:kv_cache_usage_perc", sums.get(_OLD_KV))
    return EngineMetrics(
        waiting=None if waiting is None else max(0, int(waiting)),
        running=None if running is None else max(0, int(running)),
        kv_usage=None if kv is None else min(1.0, max(0.0, kv)),
        block_size=block_size,
        num_gpu_blocks=num_blocks,
        updated_at=updated_at,
    )
