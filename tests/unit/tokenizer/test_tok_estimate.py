"""llm-d's estimate backend (``estimate_test.go`` cases): byte packing and multimodal placeholders."""

from __future__ import annotations

import base64
import struct
import zlib

import numpy as np
import xxhash

from ppc_extproc.tokenizer.estimate import (
    EstimateConfig,
    ImageEstimate,
    VideoEstimate,
    estimate_body,
    go_json,
    pack_bytes,
)


def png_data_url(w: int, h: int) -> str:
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    chunk = struct.pack(">I", 13) + b"IHDR" + ihdr + struct.pack(">I", zlib.crc32(b"IHDR" + ihdr))
    return "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n" + chunk).decode()


def tokens(b: bytes) -> list[int]:
    return np.frombuffer(b, dtype="<u4").tolist()


def test_pack_bytes_is_key_preserving() -> None:
    raw = b"the quick brown fox jumps over!!"
    assert pack_bytes(raw) == raw and len(tokens(pack_bytes(raw))) == 8
    assert pack_bytes(b"abcde") == b"abcde\x00\x00\x00"
    assert tokens(pack_bytes(b"abcd")) == [int.from_bytes(b"abcd", "little")]


def test_completions() -> None:
    assert tokens(estimate_body("completions", {"prompt": [5, 6, 7]}).prompts[0]) == [5, 6, 7]
    multi = estimate_body("completions", {"prompt": ["abcd", "efgh"], "cache_salt": "s"})
    assert multi.prompts == (b"abcd", b"efgh") and multi.cache_salt == "s"
    assert estimate_body("completions", {"prompt": "abcd"}).prompts == (b"abcd",)
    assert estimate_body("completions", {"prompt": ""}).reason == "empty"
    assert tokens(estimate_body("embeddings", {"input": [9]}).prompts[0]) == [9]


def test_chat_image_feature_and_weighting() -> None:
    url = png_data_url(64, 64)
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "describe this"}, {"type": "image_url", "image_url": {"url": url}}]}]}
    res = estimate_body("chat", body)
    (f,) = res.features
    digest = xxhash.xxh64_intdigest(url.encode())
    assert f.hash == format(digest, "x") and f.length == 64 * 64 // 1024 and f.offset == len(b"userdescribe this") // 4 + 1
    toks = tokens(res.prompts[0])
    assert toks[f.offset : f.offset + f.length] == [digest & 0xFFFFFFFF] * f.length
    assert len(toks) == f.offset + f.length


def test_image_modes() -> None:
    body = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]}]}
    assert estimate_body("chat", body, config=EstimateConfig(image=ImageEstimate(mode="static", static_token=7))).features[0].length == 7
    assert estimate_body("chat", body, config=EstimateConfig(image=ImageEstimate(factor=2048))).features[0].length == 640 * 360 // 2048
    assert estimate_body("chat", body, config=EstimateConfig(image=ImageEstimate(default_width=1024, default_height=1024))).features[0].length == 1024


def test_video_modes_and_headers() -> None:
    body = {"messages": [{"role": "user", "content": [{"type": "video_url", "video_url": {"url": "https://example.com/clip.mp4"}}]}]}
    assert estimate_body("chat", body).features[0].length == 10 * 2 * (640 * 360 // 1024)
    strided = VideoEstimate(frames_mode="strided", max_frames=16, default_source_fps=24, frame_stride=4, tpf_mode="static", tpf_static=100)
    assert estimate_body("chat", body, config=EstimateConfig(video=strided)).features[0].length == 16 * 100
    capped = VideoEstimate(max_video_tokens=50)
    assert estimate_body("chat", body, config=EstimateConfig(video=capped)).features[0].length == 50
    hdrs = {"X-LLM-D-Video-Duration-Seconds": "4", "x-llm-d-video-resolution": "1024x1024"}
    assert estimate_body("chat", body, headers=hdrs).features[0].length == 4 * 2 * 1024


def test_tools_come_first_and_change_the_prefix() -> None:
    msgs = [{"role": "system", "content": "S"}]
    plain = estimate_body("chat", {"messages": msgs}).prompts[0]
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"z": 1, "a": "<&>"}}}]
    with_tools = estimate_body("chat", {"messages": msgs, "tools": tools}).prompts[0]
    assert with_tools == pack_bytes(go_json(tools).encode() + b"systemS")
    assert plain == b"systemS\x00"
    assert go_json(tools) == '[{"function":{"name":"f","parameters":{"a":"\\u003c\\u0026\\u003e","z":1}},"type":"function"}]'


def test_anthropic_and_responses() -> None:
    body = {"system": [{"type": "text", "text": "x-anthropic-billing-header: 1"}, {"type": "text", "text": "Sys"}], "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "tool_use", "id": "t", "name": "n", "input": {"b": 1, "a": 2}}]}]}
    assert estimate_body("messages", body).prompts[0] == pack_bytes(b'Sysuserhitn{"b":1,"a":2}')
    resp = estimate_body("responses", {"instructions": "I", "input": "hello"}).prompts[0]
    assert resp == pack_bytes(b'[{"instructions":"I"},{"input":"hello"}]')
    assert go_json(1.0) == "1" and go_json(1e21) == "1e+21" and go_json(0.5) == "0.5"
