"""Local tokenizer vs the render endpoint: cold throughput and warm latency for long chats.

    python benchmarks/bench_tokenize.py [--sizes 8000,32000,100000,200000] [--repeat 30]

* cold: a conversation never seen before, tokens/s on one core — whole-text encode (no cache)
  and piece-wise encode into an empty segment cache;
* warm: the same conversation plus a new user turn (the earlier turns are cached): the whole
  routing-side path from body bytes — JSON parse, template render, added-token split, cached
  piece lookup, concatenation into LE32 bytes — with its breakdown;
* render: the same bodies through ``POST /v1/chat/completions/render`` of ``mock-vllm
  --tokenizer`` (a subprocess; its own segment cache makes its warm calls warm too) with
  :class:`RenderClient`.

The tokenizer is the tiny byte-level BPE built at run time; tokens/s scale with a real model's
vocabulary differently, chars/token is printed to compare.
"""

from __future__ import annotations

import os

os.environ.setdefault("RAYON_NUM_THREADS", "1")  # tokenizers' batch encode on one core

import argparse
import asyncio
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import orjson
from _common import header, ms, pin_to_one_core, time_calls

from ppc_extproc.tokenizer import LocalTokenizer
from ppc_extproc.tokenizer.render_client import RenderClient, RenderConfig
from ppc_extproc.tokenizer.requests import parse_chat
from ppc_extproc.tokenizer.segments import encode_text
from ppc_extproc_lab.tiny_tokenizer import _corpus, build_tiny_tokenizer


def conversation(tokens: int, tok: LocalTokenizer, seed: int) -> list[dict[str, str]]:
    """A system prompt with a RAG context and user/assistant turns, about ``tokens`` tokens."""
    rng = random.Random(seed)
    sentences = _corpus(seed, 4000)
    ratio = len("".join(sentences[:200])) / (len(tok.encode("".join(sentences[:200]), add_special_tokens=False)) // 4)
    budget = int(tokens * ratio)

    def text(chars: int) -> str:
        out: list[str] = []
        n = 0
        while n < chars:
            s = rng.choice(sentences) + " "
            out.append(s)
            n += len(s)
        return "".join(out)

    msgs = [{"role": "system", "content": "You answer from the documents.\n" + text(budget // 2)}]
    while sum(len(m["content"]) for m in msgs) < budget:
        msgs.append({"role": "user", "content": text(rng.randint(200, 2000))})
        msgs.append({"role": "assistant", "content": text(rng.randint(200, 2000))})
    msgs.append({"role": "user", "content": "Summarise the above."})
    return msgs


def start_mock(tdir: Path) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "ppc_extproc_lab.mock_vllm", "--port", "0", "--kv-events-endpoint", "", "--model", "tiny",
         "--tokenizer", str(tdir), "--num-blocks", "100000", "--log-level", "warning"],
        stdout=subprocess.PIPE, text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    return proc, json.loads(line)["engines"][0]["url"]


async def render_bench(url: str, bodies: dict[int, tuple[bytes, bytes]], repeat: int) -> dict[int, tuple[float, list[float]]]:
    out: dict[int, tuple[float, list[float]]] = {}
    async with RenderClient(RenderConfig(model_name="tiny", url=url, timeout_seconds=60, stall_seconds=60)) as client:
        for size, (cold, warm) in bodies.items():
            t0 = time.perf_counter()
            res = await client.render("chat", orjson.loads(cold))
            cold_s = time.perf_counter() - t0
            assert res.ok, res
            samples = []
            for _ in range(repeat):
                t0 = time.perf_counter()
                res = await client.render("chat", orjson.loads(warm))
                samples.append(time.perf_counter() - t0)
                assert res.ok
            out[size] = (cold_s, samples)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="8000,32000,100000,200000")
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--no-render", action="store_true")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    header("local tokenizer vs render endpoint (tiny byte-level BPE, vLLM 0.32 chat template path)")
    pin_to_one_core()
    tdir = build_tiny_tokenizer(tempfile.mkdtemp(prefix="bench-tok-"))
    probe = LocalTokenizer.from_dir(tdir, cache_bytes=0)
    bodies: dict[int, tuple[bytes, bytes]] = {}
    print("tokens     chars/tok | cold whole tok/s | cold pieces tok/s | warm e2e (parse+render+split+lookup+LE32)")
    for i, size in enumerate(sizes):
        msgs = conversation(size, probe, seed=i)
        cold_body = orjson.dumps({"model": "tiny", "messages": msgs[:-1] + [{"role": "user", "content": "First question?"}]})
        warm_body = orjson.dumps({"model": "tiny", "messages": msgs})
        bodies[size] = (cold_body, warm_body)
        uncached = LocalTokenizer.from_dir(tdir, cache_bytes=0)
        text = uncached.render_chat(parse_chat(orjson.loads(warm_body)))
        n = len(uncached.encode(text, add_special_tokens=False)) // 4
        whole = time_calls(lambda: uncached.encode(text, add_special_tokens=False), repeat=3, warmup=1)
        cold_pieces = []
        for _ in range(3):
            fresh = LocalTokenizer.from_dir(tdir)
            t0 = time.perf_counter()
            fresh.tokenize("chat", cold_body)
            cold_pieces.append(time.perf_counter() - t0)
        warm_tok = LocalTokenizer.from_dir(tdir)
        warm_tok.tokenize("chat", cold_body)  # the earlier turns, as the previous request of the session
        samples = time_calls(lambda: warm_tok.tokenize("chat", warm_body), repeat=args.repeat)
        assert warm_tok.tokenize("chat", warm_body).prompts[0] == uncached.encode(text, add_special_tokens=False)
        obj = orjson.loads(warm_body)
        chat = parse_chat(obj)
        parse_s = time_calls(lambda: parse_chat(orjson.loads(warm_body)), repeat=args.repeat)
        render_s = time_calls(lambda: warm_tok.render_chat(chat), repeat=args.repeat)
        encode_s = time_calls(lambda: encode_text(warm_tok.tokenizer, text, add_special_tokens=False, cache=warm_tok.cache), repeat=args.repeat)
        print(
            f"{n:>7,}  {len(text) / n:9.2f} | {n / statistics.median(whole):>16,.0f} | {n / statistics.median(cold_pieces):>17,.0f} | {ms(samples)}"
        )
        print(f"{'':>20}   breakdown p50: parse {statistics.median(parse_s) * 1e3:.3f} ms, render {statistics.median(render_s) * 1e3:.3f} ms, "
              f"split+lookup+LE32 {statistics.median(encode_s) * 1e3:.3f} ms ({len(text):,} chars)")
    if args.no_render:
        return
    proc, url = start_mock(tdir)
    try:
        results = asyncio.run(render_bench(url, bodies, args.repeat))
    finally:
        proc.terminate()
        proc.wait(10)
    print()
    print("render endpoint (mock-vllm --tokenizer, HTTP/1.1 keep-alive, same bodies)")
    print("tokens   | cold render call | warm render call")
    for size, (cold_s, samples) in results.items():
        print(f"~{size:>7,} | {cold_s * 1e3:13.1f} ms | {ms(samples)}")


if __name__ == "__main__":
    main()
