"""msgpack payload → ``EventBatch``, tolerant of every vLLM release and of SGLang.

Fast path: msgspec decodes vLLM's map-era (≥ 0.24) or array-era (≤ 0.23) batches straight into
the wire types, validating types in C. Anything else — SGLang's shorter arrays and trailing
metadata maps, signed or bytes hashes, 2-element batches with odd types, a single bad event — goes
through the untyped path, which normalises field by field and skips only the bad events, recording
why. Only a bad *batch* raises ``WireError``. The layouts are vLLM's
(``vllm-project/vllm: vllm/distributed/kv_events.py``) and SGLang's
(``sgl-project/sglang: python/sglang/srt/disaggregation/kv_events.py``).

The fast path reads BlockStored token ids as raw msgpack and converts them to le32 bytes
(``Le32Tokens``) without an int per token; ids outside the common uint encodings decode as a list.

Both paths return only BlockStored events that can be indexed consistently (``stored_problem``):
the tokens split evenly over the hashes, a positive block size, and at most ``MAX_EVENT_TOKENS``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgpack
import msgspec

from ppc_extproc.errors import WireError
from ppc_extproc.events.wire import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch, KVCacheEvent
from ppc_extproc.ids import MASK64
from ppc_extproc.native import msgpack_uint32_array
from ppc_extproc.tokens.le32 import Le32Tokens

__all__ = ["MAX_EVENT_TOKENS", "MAX_PAYLOAD_BYTES", "decode_batch", "normalise_hash", "stored_problem"]

#: Payloads above this size are refused without unpacking (a batch is one scheduler step).
MAX_PAYLOAD_BYTES = 64 * 1024 * 1024
#: Tokens one BlockStored may carry. An event holds the blocks one request filled in one scheduler
#: step (vLLM schedules at most ``max_num_batched_tokens`` per step, typically 2K–64K); 4M tokens
#: is a 16 MiB key computation on the ingestion thread.
MAX_EVENT_TOKENS = 1 << 22


def stored_problem(event: BlockStored) -> str | None:
    """Why a BlockStored cannot be indexed consistently (a drop reason), or None.

    Every engine key must cover the same whole number of tokens, else blocks would be indexed
    without an engine-key mapping and could never be removed. Token-less stores (offload placeholders,
    which may say ``block_size`` 0) only add a tier to blocks already mapped."""
    n_tokens = len(event.token_ids)
    if not n_tokens:
        return None
    if event.block_size <= 0:
        return "bad_block_size"
    if n_tokens > MAX_EVENT_TOKENS:
        return "too_many_tokens"
    n_hashes = len(event.block_hashes)
    if not n_hashes or n_tokens % n_hashes:
        return "tokens_not_divisible"
    return None


# --- fast path: typed msgspec decoding of vLLM batches ---------------------------------------------


class _MapBlockStored(BlockStored, tag="BlockStored", frozen=True):
    """vLLM ≥ 0.24 BlockStored with its token ids left as msgpack (``_stored_tokens``)."""

    token_ids: msgspec.Raw


class _ArrayBlockStored(BlockStored, array_like=True, tag="BlockStored", frozen=True):
    """vLLM ≤ 0.23: positional fields; missing trailing ones take their defaults."""

    token_ids: msgspec.Raw


class _ArrayBlockRemoved(BlockRemoved, array_like=True, tag="BlockRemoved", frozen=True):
    pass


class _ArrayAllBlocksCleared(AllBlocksCleared, array_like=True, tag="AllBlocksCleared", frozen=True):
    pass


class _MapBatch(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[_MapBlockStored | BlockRemoved | AllBlocksCleared]
    data_parallel_rank: int | None = None


class _ArrayBatch(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[_ArrayBlockStored | _ArrayBlockRemoved | _ArrayAllBlocksCleared]
    data_parallel_rank: int | None = None


_TYPED_DECODERS = (msgspec.msgpack.Decoder(_MapBatch), msgspec.msgpack.Decoder(_ArrayBatch))
_RAW_STORED = (_MapBlockStored, _ArrayBlockStored)
_TOKEN_LIST = msgspec.msgpack.Decoder(list[int])
_astuple = msgspec.structs.astuple


def _stored_tokens(events: list[Any]) -> list[KVCacheEvent]:
    """The typed batch's events with each raw BlockStored as a BlockStored whose token ids are
    ``Le32Tokens``, or a list of ints when the msgpack uses other int encodings (or values beyond
    uint32, which ingestion drops as ``bad_token_ids``). ``ValidationError`` when the ids are not
    an array of ints, as typed decoding of ``list[int]`` would raise."""
    out: list[KVCacheEvent] = []
    for event in events:
        if type(event) in _RAW_STORED:
            fields = _astuple(event)
            raw = fields[2]
            le32 = msgpack_uint32_array(raw)
            tokens: Le32Tokens | list[int] = _TOKEN_LIST.decode(raw) if le32 is None else Le32Tokens(le32)
            event = BlockStored(fields[0], fields[1], tokens, *fields[3:])
        out.append(event)
    return out


# --- untyped path ---------------------------------------------------------------------------------

_STORED_FIELDS = (
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "extra_keys",
    "group_idx",
    "kv_cache_spec_kind",
    "kv_cache_spec_sliding_window",
)
_REMOVED_FIELDS = ("block_hashes", "medium", "group_idx")


class _BadEvent(Exception):
    def __init__(self, reason: str) -> None:
        self.reason = reason


def normalise_hash(value: Any) -> int:
    """An engine block hash as an unsigned 64-bit int: ints masked (negative SGLang hashes wrap),
    bytes digests read as their last 8 bytes big-endian (what vLLM's int form of a digest is)."""
    if isinstance(value, bool):
        raise _BadEvent("bad_hash")
    if isinstance(value, int):
        return value & MASK64
    if isinstance(value, (bytes, bytearray)) and value:
        return int.from_bytes(value[-8:], "big")
    raise _BadEvent("bad_hash")


def _hashes(value: Any) -> list[int]:
    if not isinstance(value, list):
        raise _BadEvent("bad_hashes")
    return [normalise_hash(h) for h in value]


def _opt_str(value: Any, reason: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise _BadEvent(reason)


def _opt_int(value: Any, reason: str, minimum: int | None = None) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _BadEvent(reason)
    if minimum is not None and value < minimum:
        raise _BadEvent(reason)
    return value


def _fields(raw: list[Any] | dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    if isinstance(raw, dict):
        return {name: raw.get(name) for name in names}
    values = raw[1 : 1 + len(names)]
    out = dict(zip(names, values))
    for name in names[len(values) :]:
        out[name] = None
    return out


def _stored(raw: list[Any] | dict[str, Any], sglang: bool) -> BlockStored:
    f = _fields(raw, _STORED_FIELDS)
    cache_salt = None
    if sglang:
        # SGLang's positions stop at medium; a trailing map carries metadata such as cache_salt.
        if not isinstance(raw, dict):
            f["lora_name"] = None
        f["extra_keys"] = f["group_idx"] = f["kv_cache_spec_kind"] = None
        f["kv_cache_spec_sliding_window"] = None
        meta = raw if isinstance(raw, dict) else (raw[-1] if isinstance(raw[-1], dict) else {})
        cache_salt = _opt_str(meta.get("cache_salt"), "bad_cache_salt")
        if isinstance(f["medium"], dict):
            f["medium"] = None
    tokens = f["token_ids"]
    if not isinstance(tokens, list) or any(type(t) is not int for t in tokens):
        raise _BadEvent("bad_token_ids")
    block_size = _opt_int(f["block_size"], "bad_block_size", 0)
    if block_size is None:
        raise _BadEvent("bad_block_size")
    parent = f["parent_block_hash"]
    extra_keys = f["extra_keys"]
    if extra_keys is not None and (
        not isinstance(extra_keys, list) or any(e is not None and not isinstance(e, list) for e in extra_keys)
    ):
        raise _BadEvent("bad_extra_keys")
    lora_id = f["lora_id"]
    event = BlockStored(
        block_hashes=_hashes(f["block_hashes"]),
        parent_block_hash=None if parent is None else normalise_hash(parent),
        token_ids=tokens,
        block_size=block_size,
        lora_id=lora_id if isinstance(lora_id, int) and not isinstance(lora_id, bool) else None,
        medium=_opt_str(f["medium"], "bad_medium"),
        lora_name=_opt_str(f["lora_name"], "bad_lora_name"),
        extra_keys=extra_keys,
        group_idx=_opt_int(f["group_idx"], "bad_group_idx", 0),
        kv_cache_spec_kind=_opt_str(f["kv_cache_spec_kind"], "bad_spec_kind"),
        kv_cache_spec_sliding_window=_opt_int(f["kv_cache_spec_sliding_window"], "bad_sliding_window"),
        cache_salt=cache_salt,
    )
    problem = stored_problem(event)
    if problem is not None:
        raise _BadEvent(problem)
    return event


def _removed(raw: list[Any] | dict[str, Any], sglang: bool) -> BlockRemoved:
    f = _fields(raw, _REMOVED_FIELDS)
    medium = f["medium"]
    if sglang and isinstance(medium, dict):
        medium = None
    return BlockRemoved(
        block_hashes=_hashes(f["block_hashes"]),
        medium=_opt_str(medium, "bad_medium"),
        group_idx=None if sglang else _opt_int(f["group_idx"], "bad_group_idx", 0),
    )


def _cleared(raw: list[Any] | dict[str, Any], sglang: bool) -> AllBlocksCleared:
    return AllBlocksCleared()


_DECODERS: dict[str, Callable[[Any, bool], KVCacheEvent]] = {
    "BlockStored": _stored,
    "BlockRemoved": _removed,
    "AllBlocksCleared": _cleared,
}


def _event(raw: Any, sglang: bool) -> KVCacheEvent:
    if isinstance(raw, (bytes, bytearray)):  # a pre-packed event (llm-d's fs-backend publisher)
        try:
            raw = msgpack.unpackb(raw, raw=False, strict_map_key=False)
        except Exception:
            raise _BadEvent("bad_event_encoding") from None
    if isinstance(raw, list) and raw:
        tag = raw[0]
    elif isinstance(raw, dict):
        tag = raw.get("type")
    else:
        raise _BadEvent("bad_event_shape")
    decoder = _DECODERS.get(tag) if isinstance(tag, str) else None
    if decoder is None:
        raise _BadEvent("unknown_event_tag")
    return decoder(raw, sglang)


def _decode_untyped(payload: bytes, sglang: bool) -> EventBatch:
    try:
        batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception as exc:
        raise WireError("bad_msgpack", f"payload is not msgpack: {exc}") from None
    if not isinstance(batch, list) or len(batch) < 2:
        raise WireError("bad_batch_shape", "batch must be an array [ts, events, rank?]")
    ts, events = batch[0], batch[1]
    if isinstance(ts, bool) or not isinstance(ts, (int, float)):
        raise WireError("bad_batch_shape", "batch ts must be a number")
    if not isinstance(events, list):
        raise WireError("bad_batch_shape", "batch events must be an array")
    rank = batch[2] if len(batch) > 2 else None
    if rank is None:
        rank = 0
    elif isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise WireError("bad_batch_shape", "data_parallel_rank must be a non-negative int or nil")
    decoded: list[KVCacheEvent] = []
    skipped: list[str] = []
    for raw in events:
        try:
            decoded.append(_event(raw, sglang))
        except _BadEvent as bad:
            skipped.append(bad.reason)
        except (TypeError, ValueError, AttributeError, IndexError, msgspec.ValidationError):
            skipped.append("bad_event_fields")
    return EventBatch(float(ts), decoded, rank, skipped)


def decode_batch(payload: bytes, engine_type: str = "vllm") -> EventBatch:
    """Decode one ``KVEventBatch`` payload. Raises ``WireError`` when the batch itself is bad;
    bad events are skipped and listed in ``EventBatch.skipped``."""
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise WireError("payload_too_large", f"payload of {len(payload)} bytes")
    sglang = engine_type == "sglang"
    if not sglang:
        for decoder in _TYPED_DECODERS:
            try:
                batch = decoder.decode(payload)
                events = _stored_tokens(batch.events)
            except (msgspec.ValidationError, msgspec.DecodeError):
                continue
            rank = batch.data_parallel_rank
            if rank is None or rank >= 0:
                for event in events:  # stored_problem, inlined: this loop runs for every batch
                    if isinstance(event, BlockStored):
                        n_tokens = len(event.token_ids)
                        if n_tokens and (
                            event.block_size <= 0
                            or n_tokens > MAX_EVENT_TOKENS
                            or not event.block_hashes
                            or n_tokens % len(event.block_hashes)
                        ):
                            return _consistent(batch.ts, events, rank or 0)
                return EventBatch(batch.ts, events, rank or 0)
    return _decode_untyped(payload, sglang)


def _consistent(ts: float, events: list[KVCacheEvent], rank: int) -> EventBatch:
    """The batch without its inconsistent BlockStored events, each listed as skipped."""
    kept: list[KVCacheEvent] = []
    skipped: list[str] = []
    for event in events:
        problem = stored_problem(event) if isinstance(event, BlockStored) else None
        if problem is None:
            kept.append(event)
        else:
            skipped.append(problem)
    return EventBatch(ts, kept, rank, skipped)
