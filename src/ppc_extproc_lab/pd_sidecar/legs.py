"""The request bodies of llm-d's routing sidecar legs, and its ``cached_tokens`` rewrite.

Read from ``llm-d/llm-d-router`` (main, 2026-08): ``pkg/sidecar/proxy/connector_nixlv2.go``
(``handleNIXLV2``, the serial READ-mode path), ``connector_shared_storage.go``, ``proxy.go``
(``tokenLimitFieldsForAPIType``) and ``cached_tokens_usage_rewriter.go``.

nixlv2, prefill leg: the client's body with ``kv_transfer_params = {do_remote_decode: true,
do_remote_prefill: false, remote_engine_id/remote_block_ids/remote_host/remote_port: null}``,
``stream: false``, no ``stream_options`` and every token-limit field of the API set to 1
(``max_tokens``, ``max_completion_tokens``, ``min_tokens``; ``max_output_tokens`` for Responses;
``sampling_params.max_tokens``/``min_tokens`` for ``/inference/v1/generate``, the map created if
absent). Decode leg: the client's body again (``stream``/``stream_options``/limits restored, a
created empty ``sampling_params`` dropped) with the prefiller's returned ``kv_transfer_params``
(JSON null when the prefiller returned none).

shared-storage: prefill is the body with ``max_tokens``/``max_completion_tokens`` = 1 and
``cache_hit_threshold`` = 0 (``stream`` untouched); decode is the body with
``cache_hit_threshold`` = 0.
"""

from __future__ import annotations

import copy
import enum
from typing import Any, Final

import orjson

__all__ = [
    "ApiType",
    "cached_tokens_of",
    "nixl_decode_body",
    "nixl_prefill_body",
    "rewrite_cached_tokens_json",
    "rewrite_cached_tokens_sse_line",
    "shared_storage_decode_body",
    "shared_storage_prefill_body",
]


class ApiType(enum.Enum):
    """Which token-limit fields a path has (``proxy.go``: ``APIType``)."""

    CHAT_COMPLETIONS = "chat_completions"  # /v1/chat/completions, /v1/completions, /v1/messages
    RESPONSES = "responses"
    GENERATE = "generate"


_TOKEN_LIMIT_FIELDS: Final = {
    ApiType.CHAT_COMPLETIONS: ("max_tokens", "max_completion_tokens", "min_tokens"),
    ApiType.RESPONSES: ("max_output_tokens",),
    ApiType.GENERATE: ("max_tokens", "min_tokens"),
}

#: The prefill leg's ``kv_transfer_params`` (nixlv2 READ mode).
_PREFILL_KV_PARAMS: Final[dict[str, Any]] = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}


def nixl_prefill_body(body: dict[str, Any], api: ApiType) -> dict[str, Any]:
    """The nixlv2 prefill leg's body (``body`` is not modified)."""
    out = copy.deepcopy(body)
    out["kv_transfer_params"] = dict(_PREFILL_KV_PARAMS)
    out["stream"] = False
    out.pop("stream_options", None)
    limits = out
    if api is ApiType.GENERATE:
        sampling = out.get("sampling_params")
        if not isinstance(sampling, dict):
            sampling = out["sampling_params"] = {}
        limits = sampling
    for field in _TOKEN_LIMIT_FIELDS[api]:
        limits[field] = 1
    return out


def nixl_decode_body(body: dict[str, Any], prefill_kv_params: object) -> dict[str, Any]:
    """The nixlv2 decode leg's body: the client's with the prefiller's ``kv_transfer_params``."""
    out = copy.deepcopy(body)
    out["kv_transfer_params"] = prefill_kv_params
    return out


def shared_storage_prefill_body(body: dict[str, Any]) -> dict[str, Any]:
    """The shared-storage prefill leg's body."""
    out = copy.deepcopy(body)
    out["max_tokens"] = 1
    out["max_completion_tokens"] = 1
    out["cache_hit_threshold"] = 0
    return out


def shared_storage_decode_body(body: dict[str, Any]) -> dict[str, Any]:
    """The shared-storage decode leg's body."""
    out = copy.deepcopy(body)
    out["cache_hit_threshold"] = 0
    return out


def cached_tokens_of(response: object) -> int:
    """``usage.prompt_tokens_details.cached_tokens`` of a response, 0 when absent (vLLM returns
    ``prompt_tokens_details: null`` when nothing was cached)."""
    if not isinstance(response, dict):
        return 0
    usage = response.get("usage")
    details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
    value = details.get("cached_tokens") if isinstance(details, dict) else None
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0


def _set_cached_tokens(response: object, cached_tokens: int) -> bool:
    if not isinstance(response, dict) or not isinstance(response.get("usage"), dict):
        return False
    usage = response["usage"]
    details = usage.get("prompt_tokens_details")
    if not isinstance(details, dict):
        usage["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
        return True
    if details.get("cached_tokens") == cached_tokens:
        return False
    details["cached_tokens"] = cached_tokens
    return True


def rewrite_cached_tokens_json(raw: bytes, cached_tokens: int) -> bytes:
    """A JSON body with its usage's ``cached_tokens`` set (a body without usage, or not JSON,
    is returned unchanged)."""
    try:
        response = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw
    return orjson.dumps(response) if _set_cached_tokens(response, cached_tokens) else raw


def rewrite_cached_tokens_sse_line(line: bytes, cached_tokens: int) -> bytes:
    """One SSE line (with its line ending) with a ``data: {json}`` frame's usage rewritten."""
    stripped = line.rstrip(b"\r\n")
    ending = line[len(stripped):]
    if not stripped.startswith(b"data: ") or stripped[6:].strip() == b"[DONE]":
        return line
    return b"data: " + rewrite_cached_tokens_json(stripped[6:], cached_tokens) + ending
