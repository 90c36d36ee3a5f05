"""``kv_transfer_params`` as vLLM's NixlConnector reads and writes them, for the mock's P/D roles
(``vllm-project/vllm: vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py``).

* A request with ``do_remote_decode: true`` is a **prefill** leg: it runs as usual and, when it
  finishes by hitting its token cap (``finish_reason: "length"``), its response carries the
  parameters a decode engine needs: ``do_remote_prefill: true, do_remote_decode: false,
  remote_block_ids, remote_engine_id, remote_request_id, remote_host, remote_port, tp_size``
  (``NixlConnectorScheduler.request_finished``).
* A request with ``do_remote_prefill: true`` is a **decode** leg: the prompt tokens it does not
  hold locally are "transferred" instead of prefilled. vLLM pulls only when ``remote_block_ids``
  is non-empty and ``remote_engine_id``, ``remote_request_id``, ``remote_host`` and
  ``remote_port`` are all present (``update_state_after_alloc``); otherwise it logs
  "Got invalid KVTransferParams" and the request gets no transfer — the mock then prefills
  locally and counts it (``kv_transfer_invalid``).

The mock keeps no prefill blocks pinned for the decoder to read (vLLM holds them until the read
or ``VLLM_NIXL_ABORT_REQUEST_TIMEOUT``); its blocks stay in the prefix cache as any finished
request's do.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from aiohttp import web

from ppc_extproc_lab.mock_vllm.request import EngineRequest, RequestRejected

__all__ = [
    "DEFAULT_SIDE_CHANNEL_PORT",
    "KV_SIDE",
    "KV_TRANSFER_HEADER",
    "REQUEST_LOG",
    "REQUEST_LOG_SIZE",
    "KvSide",
    "KvTransfer",
    "RequestLog",
    "leg_header",
    "parse_kv_transfer_params",
    "prefill_result_params",
    "record_request",
    "response_params",
]

#: ``VLLM_NIXL_SIDE_CHANNEL_PORT``'s default (``vllm/envs.py``); engine ``i`` advertises ``+ i``.
DEFAULT_SIDE_CHANNEL_PORT: Final = 5600
#: Response header naming a request's P/D leg: ``prefill`` (``do_remote_decode``), ``decode``
#: (``do_remote_prefill`` with pullable parameters) or ``decode-invalid`` (prefilled locally).
KV_TRANSFER_HEADER: Final = "x-mock-vllm-kv-transfer"
#: Entries kept by ``GET /mock/requests``.
REQUEST_LOG_SIZE: Final = 256

#: The fields without which vLLM's decode side does not pull (``update_state_after_alloc``).
_REMOTE_FIELDS: Final = ("remote_engine_id", "remote_request_id", "remote_host", "remote_port")


@dataclass(frozen=True, slots=True)
class KvTransfer:
    """The P/D role a request's ``kv_transfer_params`` give it."""

    #: A prefill leg: return ``kv_transfer_params`` for a remote decoder.
    do_remote_decode: bool
    #: A decode leg that asked for remote KV.
    do_remote_prefill: bool
    #: A decode leg whose parameters name a readable remote prefill (vLLM's check).
    pull_valid: bool
    params: dict[str, Any]


def parse_kv_transfer_params(value: object) -> KvTransfer | None:
    """The role of a body's ``kv_transfer_params`` (``dict | None`` as vLLM's request models)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise RequestRejected("kv_transfer_params must be an object or null.")
    remote_prefill = bool(value.get("do_remote_prefill"))
    valid = remote_prefill and bool(value.get("remote_block_ids")) and all(f in value for f in _REMOTE_FIELDS)
    return KvTransfer(
        do_remote_decode=bool(value.get("do_remote_decode")) and not remote_prefill,
        do_remote_prefill=remote_prefill,
        pull_valid=valid,
        params=dict(value),
    )


def prefill_result_params(
    *, block_ids: list[int], engine_id: str, request_id: str, host: str, port: int, tp_size: int = 1
) -> dict[str, Any]:
    """What a finished prefill leg returns (``NixlConnectorScheduler.request_finished``)."""
    return {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_block_ids": block_ids,
        "remote_engine_id": engine_id,
        "remote_request_id": request_id,
        "remote_host": host,
        "remote_port": port,
        "tp_size": tp_size,
    }


@dataclass(frozen=True, slots=True)
class KvSide:
    """What an engine's prefill legs name themselves by: vLLM's ``kv_transfer_config.engine_id``
    (a uuid4 by default) and its NIXL side channel (``VLLM_NIXL_SIDE_CHANNEL_HOST``/``_PORT``)."""

    engine_id: str
    host: str
    port: int


def response_params(side: KvSide, req: EngineRequest) -> dict[str, Any] | None:
    """The response's ``kv_transfer_params``: set for a finished prefill leg, else None. Every
    mock request ends at its token cap (``length``), the case in which vLLM hands over."""
    if req.kv is None or not req.kv.do_remote_decode:
        return None
    return prefill_result_params(
        block_ids=req.block_ids, engine_id=side.engine_id, request_id=req.request_id,
        host=side.host, port=side.port,
    )


_TOKEN_FIELDS: Final = ("max_tokens", "max_completion_tokens", "min_tokens", "max_output_tokens")


class RequestLog:
    """The last :data:`REQUEST_LOG_SIZE` inference requests an engine received, as tests ask about
    them: path, ``x-request-id``, token limits, ``stream``, ``kv_transfer_params`` and
    ``cache_hit_threshold``."""

    def __init__(self, size: int = REQUEST_LOG_SIZE) -> None:
        self._entries: deque[dict[str, Any]] = deque(maxlen=size)

    def record(self, path: str, headers: Mapping[str, str], body: object) -> None:
        """Note one request (a body that is not an object is noted with its path only)."""
        entry: dict[str, Any] = {"path": path, "x_request_id": headers.get("x-request-id")}
        if isinstance(body, dict):
            sampling = body.get("sampling_params")
            limits: dict[str, Any] = sampling if isinstance(sampling, dict) else body
            entry.update({f: limits[f] for f in _TOKEN_FIELDS if f in limits})
            entry["stream"] = body.get("stream")
            entry["has_stream_options"] = "stream_options" in body
            entry["kv_transfer_params"] = body.get("kv_transfer_params")
            if "cache_hit_threshold" in body:
                entry["cache_hit_threshold"] = body["cache_hit_threshold"]
        self._entries.append(entry)

    def entries(self) -> list[dict[str, Any]]:
        """Oldest first."""
        return list(self._entries)

    def clear(self) -> None:
        self._entries.clear()


#: The engine's NIXL identity (``create_app``).
KV_SIDE: Final = web.AppKey("kv_side", KvSide)
#: The engine's :class:`RequestLog`.
REQUEST_LOG: Final = web.AppKey("request_log", RequestLog)


#: Where a request's role is kept (``web.RequestKey`` from aiohttp 3.12 on; a string before).
_KV_ROLE: Final[Any] = (
    web.RequestKey("mock_kv_role", KvTransfer) if hasattr(web, "RequestKey") else "mock_kv_role"
)


def record_request(request: web.Request, body: object) -> KvTransfer | None:
    """Log an inference request and return its P/D role (raises :class:`RequestRejected`); the
    role is kept on the request for :func:`leg_header`."""
    log = request.app.get(REQUEST_LOG)
    if log is not None:
        log.record(request.path, request.headers, body)
    kv = parse_kv_transfer_params(body.get("kv_transfer_params") if isinstance(body, dict) else None)
    if kv is not None:
        request[_KV_ROLE] = kv
    return kv


def leg_header(request: web.BaseRequest) -> str | None:
    """The :data:`KV_TRANSFER_HEADER` value of a request seen by :func:`record_request`."""
    kv = request.get(_KV_ROLE)
    if not isinstance(kv, KvTransfer):
        return None
    if kv.do_remote_prefill:
        return "decode" if kv.pull_valid else "decode-invalid"
    return "prefill" if kv.do_remote_decode else None
