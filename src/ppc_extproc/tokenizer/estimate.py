"""llm-d's ``estimate`` backend: request bytes packed into pseudo-tokens (content locality only).

Ported from ``llm-d/llm-d-router: pkg/epp/framework/plugins/requestcontrol/dataproducer/tokenizer/``
``estimate.go`` and ``mm_estimate.go``. Token ``i`` is the little-endian uint32 of bytes
``[4i, 4i+4)`` of the zero-padded byte stream, so the LE32 form of the tokens *is* the padded
stream. Multimodal assets are aligned to a token boundary and occupy ``N`` copies of
``low32(xxh64(asset))``, reported as a feature ``{hash: hex(xxh64), offset, length: N}``. JSON
parts use Go ``encoding/json`` conventions (sorted keys, compact, ``<>&`` escaped).

These ids never match an engine's KV blocks: feeding them to the precise producer defeats
precise routing (the plugin warns at startup).
"""

from __future__ import annotations

import base64
import binascii
import math
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson
import xxhash

from ppc_extproc.tokenizer.requests import Api
from ppc_extproc.tokenizer.result import EMPTY, UNSUPPORTED_BODY, TokenizeResult
from ppc_extproc.tokens.prompt import MultimodalFeature

__all__ = ["EstimateConfig", "ImageEstimate", "VideoEstimate", "estimate_body", "go_json", "pack_bytes"]

BYTES_PER_TOKEN = 4
_BILLING_HEADER = "x-anthropic-billing-header"


@dataclass(frozen=True, slots=True)
class ImageEstimate:
    """``estimate.image``: ``dynamic`` = w·h/factor (data-URL size, else ``default_*``), ``static``."""

    mode: Literal["dynamic", "static"] = "dynamic"
    default_width: int = 640
    default_height: int = 360
    factor: int = 1024
    static_token: int = 1


@dataclass(frozen=True, slots=True)
class VideoEstimate:
    """``estimate.video``: ``min(frames × tokensPerFrame, maxVideoTokens)``, at least 1."""

    default_width: int = 640
    default_height: int = 360
    default_duration_seconds: float = 10.0
    max_video_tokens: int = 0
    tpf_mode: Literal["dynamic", "static"] = "dynamic"
    tpf_factor: int = 1024
    tpf_static: int = 1
    frames_mode: Literal["sampled", "strided"] = "sampled"
    min_frames: int = 0
    max_frames: int = 0
    sample_fps: float = 2.0
    temporal_patch_size: int = 0
    default_source_fps: float = 24.0
    frame_stride: int = 1


@dataclass(frozen=True, slots=True)
class EstimateConfig:
    image: ImageEstimate = field(default_factory=ImageEstimate)
    video: VideoEstimate = field(default_factory=VideoEstimate)


def pack_bytes(raw: bytes) -> bytes:
    """``packBytes``: the LE32 token bytes of ``raw`` (zero-padded to a multiple of 4)."""
    return raw + b"\x00" * (-len(raw) % BYTES_PER_TOKEN)


# --- Go encoding/json ---------------------------------------------------------------------------------

_GO_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def _go_str(s: str) -> str:
    out = ['"']
    for ch in s:
        esc = _GO_ESCAPES.get(ch)
        if esc is not None:
            out.append(esc)
        elif ch < " ":
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _go_float(x: float) -> str:
    if x.is_integer() and abs(x) < 1e21:
        return str(int(x))
    r = repr(x)
    if "e" in r:
        mant, exp = r.split("e")
        sign = "-" if exp.startswith("-") else "+"
        digits = exp.lstrip("+-").lstrip("0") or "0"
        return f"{mant}e{sign}{digits.zfill(2)}"
    return r


def go_json(value: Any) -> str:
    """``json.Marshal`` of a value decoded into Go's ``any`` (maps sorted, compact, HTML-escaped)."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, str):
        return _go_str(value)
    if isinstance(value, int):
        return _go_float(float(value)) if abs(value) >= 2**53 else str(value)
    if isinstance(value, float):
        return _go_float(value)
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{_go_str(k)}:{go_json(value[k])}" for k in sorted(value)) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(go_json(v) for v in value) + "]"
    raise TypeError(f"not JSON: {type(value).__name__}")


# --- multimodal placeholders -------------------------------------------------------------------------


def _image_size(data: bytes) -> tuple[int, int] | None:
    """Width and height from a PNG, GIF or JPEG header (what Go's image.DecodeConfig reads)."""
    if data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) >= 24:
        w, h = struct.unpack(">II", data[16:24])
        return w, h
    if data[:6] in (b"GIF87a", b"GIF89a") and len(data) >= 10:
        w, h = struct.unpack("<HH", data[6:10])
        return w, h
    if data[:2] == b"\xff\xd8":
        i = 2
        while i + 9 < len(data):
            if data[i] != 0xFF:
                return None
            marker = data[i + 1]
            length = struct.unpack(">H", data[i + 2 : i + 4])[0]
            if marker in (0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF):
                h, w = struct.unpack(">HH", data[i + 5 : i + 9])
                return w, h
            i += 2 + length
    return None


def _b64_size(payload: str) -> tuple[int, int] | None:
    try:
        head = base64.b64decode(payload[: 64 * 1024 - (64 * 1024) % 4] if len(payload) > 65536 else payload, validate=False)
    except (binascii.Error, ValueError):
        return None
    size = _image_size(head)
    return size if size and size[0] > 0 and size[1] > 0 else None


def _image_count(cfg: ImageEstimate, size: tuple[int, int] | None) -> int:
    if cfg.mode == "static":
        return max(cfg.static_token, 1)
    w, h = size or (cfg.default_width or 640, cfg.default_height or 360)
    return max((w * h) // (cfg.factor or 1024), 1)


def _url_size(url: str) -> tuple[int, int] | None:
    if not url.startswith("data:image/") or "base64," not in url:
        return None
    return _b64_size(url[url.index("base64,") + len("base64,") :])


def _video_count(cfg: VideoEstimate, headers: Mapping[str, str]) -> int:
    def header_float(name: str) -> float:
        try:
            v = float(headers.get(name, ""))
        except ValueError:
            return 0.0
        return v if v > 0 and math.isfinite(v) else 0.0

    duration = header_float("x-llm-d-video-duration-seconds") or cfg.default_duration_seconds or 10.0
    if cfg.frames_mode == "strided":
        fps = header_float("x-llm-d-video-fps") or cfg.default_source_fps or 24.0
        frames = int(duration * fps) // max(cfg.frame_stride, 1)
    else:
        frames = int(duration * (cfg.sample_fps or 2.0))
    if cfg.min_frames > 0:
        frames = max(frames, cfg.min_frames)
    if cfg.max_frames > 0:
        frames = min(frames, cfg.max_frames)
    if cfg.frames_mode != "strided" and cfg.temporal_patch_size > 1:
        frames //= cfg.temporal_patch_size
    if cfg.tpf_mode == "static":
        tpf = max(cfg.tpf_static, 1)
    else:
        w, h = cfg.default_width or 640, cfg.default_height or 360
        res = headers.get("x-llm-d-video-resolution", "")
        if "x" in res.lower():
            a, _, b = res.lower().partition("x")
            if a.strip().isdigit() and b.strip().isdigit() and int(a) > 0 and int(b) > 0:
                w, h = int(a), int(b)
        tpf = max((w * h) // (cfg.tpf_factor or 1024), 1)
    tokens = frames * tpf
    if cfg.max_video_tokens > 0:
        tokens = min(tokens, cfg.max_video_tokens)
    return max(tokens, 1)


class _Stream:
    def __init__(self) -> None:
        self.buf = bytearray()
        self.features: list[MultimodalFeature] = []

    def text(self, s: str) -> None:
        self.buf += s.encode("utf-8")

    def asset(self, content: str, count: int) -> None:
        self.buf += b"\x00" * (-len(self.buf) % BYTES_PER_TOKEN)
        offset = len(self.buf) // BYTES_PER_TOKEN
        digest = xxhash.xxh64_intdigest(content.encode("utf-8"))
        self.buf += (digest & 0xFFFFFFFF).to_bytes(4, "little") * count
        self.features.append(MultimodalFeature(format(digest, "x"), offset, count))


def _str(v: Any) -> str:
    return v if isinstance(v, str) else ""


def _blocks(obj: Mapping[str, Any], out: _Stream) -> Iterator[dict[str, Any]]:
    """Per message: append its role and string content; yield its content parts/blocks."""
    for m in obj.get("messages") or []:
        if not isinstance(m, dict):
            continue
        out.text(_str(m.get("role")))
        content = m.get("content")
        if isinstance(content, str) and content:
            out.text(content)
            continue
        for part in content if isinstance(content, list) else []:
            if isinstance(part, dict):
                yield part


def _chat(obj: Mapping[str, Any], cfg: EstimateConfig, headers: Mapping[str, str]) -> _Stream:
    out = _Stream()
    if obj.get("tools"):
        out.text(go_json(obj["tools"]))
    for part in _blocks(obj, out):
        kind = part.get("type")
        if kind == "text":
            out.text(_str(part.get("text")))
        elif kind == "image_url":
            url = _str((part.get("image_url") or {}).get("url"))
            out.asset(url, _image_count(cfg.image, _url_size(url)))
        elif kind == "video_url":
            out.asset(_str((part.get("video_url") or {}).get("url")), _video_count(cfg.video, headers))
        elif kind in ("input_audio", "audio_url"):
            audio = part.get("input_audio") or {}
            data = _str(audio.get("data")) + _str(audio.get("format"))
            out.asset(data, max(math.ceil(len(data) / BYTES_PER_TOKEN), 1))
    return out


def _anthropic_image(out: _Stream, cfg: ImageEstimate, src: Any) -> None:
    if not isinstance(src, dict):
        return
    if src.get("url"):
        out.asset(src["url"], _image_count(cfg, _url_size(src["url"])))
    elif src.get("data"):
        out.asset(src["data"], _image_count(cfg, _b64_size(src["data"])))


def _messages(obj: Mapping[str, Any], cfg: EstimateConfig) -> _Stream:
    out = _Stream()
    if obj.get("tools"):
        out.text(go_json(obj["tools"]))
    system = obj.get("system")
    if isinstance(system, str):
        out.text(system)
    elif isinstance(system, list):
        out.text("".join(b["text"] for b in system if isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str) and b["text"] and not b["text"].startswith(_BILLING_HEADER)))
    for b in _blocks(obj, out):
        kind = b.get("type")
        if kind == "text":
            out.text(_str(b.get("text")))
        elif kind == "image":
            _anthropic_image(out, cfg.image, b.get("source"))
        elif kind == "thinking":
            out.text(_str(b.get("thinking")))
        elif kind == "tool_use":
            out.text(_str(b.get("id")) + _str(b.get("name")))
            if "input" in b:
                out.buf += orjson.dumps(b["input"])
        elif kind == "tool_result":
            c = b.get("content")
            if isinstance(c, str) and c:
                out.text(c)
            elif isinstance(c, list):
                out.text("\n".join(_str(i.get("text")) for i in c if isinstance(i, dict) and i.get("type") == "text"))
                for i in c:
                    if isinstance(i, dict) and i.get("type") == "image":
                        src = i.get("source") or {}
                        url = src.get("url") or (f"data:{src.get('media_type') or 'image/jpeg'};base64,{src['data']}" if src.get("data") else "")
                        if url:
                            out.asset(url, _image_count(cfg.image, _url_size(url)))
    return out


def estimate_body(
    api: Api | Literal["embeddings", "conversations"],
    obj: Mapping[str, Any],
    *,
    config: EstimateConfig | None = None,
    headers: Mapping[str, str] | None = None,
) -> TokenizeResult:
    """Pseudo-tokens of a request body, as llm-d's estimate backend produces them."""
    cfg = config or EstimateConfig()
    hdrs = {k.lower(): v for k, v in (headers or {}).items()}
    salt = obj.get("cache_salt") if isinstance(obj.get("cache_salt"), str) else None
    features: tuple[MultimodalFeature, ...] = ()
    prompts: tuple[bytes, ...]
    if api == "completions":
        prompt = obj.get("prompt")
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            prompts = (b"".join(int(t).to_bytes(4, "little") for t in prompt),)
        elif isinstance(prompt, list) and len(prompt) > 1 and all(isinstance(s, str) for s in prompt):
            prompts = tuple(pack_bytes(s.encode("utf-8")) for s in prompt)
        elif isinstance(prompt, list) and all(isinstance(s, str) for s in prompt):
            prompts = (pack_bytes(" ".join(prompt).encode("utf-8")),)
        else:
            prompts = (pack_bytes(_str(prompt).encode("utf-8")),)
    elif api in ("chat", "messages"):
        stream = _chat(obj, cfg, hdrs) if api == "chat" else _messages(obj, cfg)
        prompts, features = (pack_bytes(bytes(stream.buf)),), tuple(stream.features)
    elif api == "responses":
        combined: list[dict[str, Any]] = []
        if obj.get("instructions") is not None:
            combined.append({"instructions": obj["instructions"]})
        if obj.get("tools") is not None:
            combined.append({"tools": obj["tools"]})
        combined.append({"input": obj.get("input")})
        prompts = (pack_bytes(go_json(combined).encode("utf-8")),)
    elif api == "conversations":
        prompts = (pack_bytes(go_json(obj.get("items")).encode("utf-8")),)
    elif api == "embeddings":
        inp = obj.get("input")
        if isinstance(inp, list) and inp and all(isinstance(t, int) and not isinstance(t, bool) for t in inp):
            prompts = (b"".join(int(t).to_bytes(4, "little") for t in inp),)
        else:
            prompts = (pack_bytes(go_json(inp).encode("utf-8")),)
    else:
        return TokenizeResult.failed(UNSUPPORTED_BODY, "unsupported request body type, skipping estimation", salt)
    if not any(prompts):
        return TokenizeResult.failed(EMPTY, "no bytes to estimate", salt)
    return TokenizeResult(prompts, features=features, cache_salt=salt)
