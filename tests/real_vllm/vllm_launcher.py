"""Start a real vLLM OpenAI server from the flags ``LocalCluster`` gives a mock engine.

Run with the vLLM venv's python (it imports nothing from ppc-extproc)::

    python vllm_launcher.py --host 127.0.0.2 --port 8000 --model tiny --tokenizer MODEL_DIR \\
        --kv-events-endpoint tcp://127.0.0.2:5557 [--replay-endpoint tcp://127.0.0.2:5559] \\
        [--block-size 32] [--num-blocks 4096] [-- extra vLLM flags]

and replaces itself (``exec``, same pid and process group) with::

    python -m vllm.entrypoints.cli.main serve MODEL_DIR --served-model-name tiny --host … --port … \\
        --enable-prefix-caching --enable-prompt-tokens-details --enable-scale-out \\
        --kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq", …}'

Translations:

* ``--tokenizer DIR`` is the model directory (config, weights, tokenizer, chat template) and
  ``--model`` the served model name, which also ends the KV-event topic ``kv@ip:port@model``.
* The PUB endpoint ``tcp://IP:PORT`` becomes ``tcp://[::ffff:IP]:PORT``: vLLM binds an endpoint
  only when it contains ``*`` or ``::`` and connects to any other
  (vllm-project/vllm: vllm/distributed/kv_events.py ``ZmqEventPublisher._is_bind_endpoint``), and
  ``tcp://*:PORT`` would take the port on every address, so several engines could not share it.
  The replay ROUTER socket is always bound, so its endpoint is passed as given.
* ``--num-blocks`` becomes ``--num-gpu-blocks-override`` (also honoured by the CPU backend).

Every other argument is passed to ``vllm serve`` unchanged.
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def vllm_argv(argv: list[str]) -> list[str]:
    parser = argparse.ArgumentParser(prog="vllm_launcher")
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", required=True)
    parser.add_argument("--model", required=True, help="served model name")
    parser.add_argument("--tokenizer", required=True, help="model directory")
    parser.add_argument("--kv-events-endpoint", required=True)
    parser.add_argument("--replay-endpoint")
    parser.add_argument("--block-size", default="32")
    parser.add_argument("--num-blocks")
    args, extra = parser.parse_known_args(argv)
    if extra[:1] == ["--"]:
        extra = extra[1:]
    scheme, _, address = args.kv_events_endpoint.partition("://")
    ip, _, port = address.rpartition(":")
    kv_config: dict[str, object] = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"{scheme}://[::ffff:{ip}]:{port}",
        "topic": f"kv@{args.host}:{args.port}@{args.model}",
    }
    if args.replay_endpoint:
        kv_config["replay_endpoint"] = args.replay_endpoint
    out = [
        sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", args.tokenizer,
        "--served-model-name", args.model,
        "--host", args.host, "--port", str(args.port),
        "--block-size", str(args.block_size),
        "--enable-prefix-caching", "--enable-prompt-tokens-details", "--enable-scale-out",
        "--kv-events-config", json.dumps(kv_config),
    ]  # fmt: skip
    if args.num_blocks:
        out += ["--num-gpu-blocks-override", str(args.num_blocks)]
    return out + extra


def main() -> None:
    argv = vllm_argv(sys.argv[1:])
    print("vllm_launcher: exec", " ".join(argv), flush=True)
    os.execv(argv[0], argv)


if __name__ == "__main__":
    main()
