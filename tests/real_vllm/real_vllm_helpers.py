"""Helpers of the real-vLLM tests: where vLLM is, a tiny random-weight model, engine commands.

* :func:`vllm_python` — ``PPC_VLLM_PYTHON``, else the venv ``scripts/setup_real_vllm.sh`` makes
  (``PPC_VLLM_VENV``, default ``~/.cache/ppc-extproc/vllm-venv``); ``None`` when absent.
* :func:`build_tiny_model` — the tiny tokenizer of :mod:`ppc_extproc_lab.tiny_tokenizer` plus a
  2-layer Llama (hidden 64, 2 heads of 32) with seeded random weights, written as
  ``config.json`` + ``model.safetensors``: a model directory vLLM serves as it would a Hub one.
* :func:`engine_command` / :data:`ENGINE_ENV` — ``vllm_launcher.py`` under the vLLM python, and
  the environment that keeps vLLM on this machine (no usage reporting, no Hub, a small KV cache).
"""

from __future__ import annotations

import json
import os
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file
from tokenizers import Tokenizer

from ppc_extproc_lab.tiny_tokenizer import build_tiny_tokenizer

LAUNCHER = Path(__file__).with_name("vllm_launcher.py")
SETUP_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "setup_real_vllm.sh"
MODEL = "tiny"
#: vLLM's CPU attention needs a block size that is a multiple of 32.
BLOCK = 32
#: Seconds an engine may take to answer /health (25–35 s alone on 2 cores; several start at once).
STARTUP_TIMEOUT = 600.0

#: What the tests saw, by topic (``parity``: bodies compared per case); printed in the terminal summary.
OBSERVED: defaultdict[str, Counter[str]] = defaultdict(Counter)
#: Lines of the routing test (one per request), printed in the terminal summary.
ROUTING_LOG: list[str] = []

ENGINE_ENV = {
    "VLLM_NO_USAGE_STATS": "1",  # vllm/usage/usage_lib.py would post usage data to the Internet
    "DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB per engine (the default takes a large share of RAM)
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",  # several engines share 2 cores: let the OS place them
    "OMP_NUM_THREADS": "1",
    "TOKENIZERS_PARALLELISM": "false",
}
#: Flags every engine gets after the launcher's (small batches, no CUDA-graph-like compilation).
ENGINE_ARGS = ("--dtype", "float32", "--max-model-len", "4096", "--max-num-seqs", "8", "--enforce-eager", "--seed", "0")


def default_venv() -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return Path(os.environ.get("PPC_VLLM_VENV") or cache / "ppc-extproc" / "vllm-venv")


def vllm_python() -> str | None:
    """The python of a vLLM install, or None (the tests then skip)."""
    explicit = os.environ.get("PPC_VLLM_PYTHON")
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    candidate = default_venv() / "bin" / "python"
    return str(candidate) if os.access(candidate, os.X_OK) else None


def skip_reason() -> str:
    script = SETUP_SCRIPT.relative_to(SETUP_SCRIPT.parents[1])
    explicit = os.environ.get("PPC_VLLM_PYTHON")
    if explicit:
        return f"PPC_VLLM_PYTHON={explicit} is not an executable file"
    return f"no vLLM install at {default_venv()}: run {script} (or set PPC_VLLM_PYTHON to a python with vLLM 0.32)"


def engine_command(python: str, *vllm_args: str) -> list[str]:
    """The engine command for ``LocalCluster(engine_command=…)``: it appends the mock flags."""
    return [python, str(LAUNCHER), *ENGINE_ARGS, *vllm_args]


def build_tiny_model(directory: Path, *, hidden: int = 64, layers: int = 2, head_dim: int = 32, seed: int = 0) -> Path:
    """Tokenizer files + ``config.json`` + ``model.safetensors`` of a random Llama in ``directory``."""
    path = build_tiny_tokenizer(directory)
    vocab = Tokenizer.from_file(str(path / "tokenizer.json")).get_vocab_size()
    heads, intermediate = hidden // head_dim, 2 * hidden
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": vocab,
        "hidden_size": hidden, "intermediate_size": intermediate, "num_hidden_layers": layers,
        "num_attention_heads": heads, "num_key_value_heads": heads, "head_dim": head_dim,
        "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu",
        "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0,
        "torch_dtype": "float32",
    }  # fmt: skip
    (path / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    rng = np.random.default_rng(seed)

    def weight(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    ones = np.ones(hidden, np.float32)
    tensors = {"model.embed_tokens.weight": weight(vocab, hidden), "model.norm.weight": ones, "lm_head.weight": weight(vocab, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        for name in ("q_proj", "k_proj", "v_proj"):
            tensors[f"{p}self_attn.{name}.weight"] = weight(heads * head_dim, hidden)
        tensors[f"{p}self_attn.o_proj.weight"] = weight(hidden, heads * head_dim)
        tensors[f"{p}mlp.gate_proj.weight"] = weight(intermediate, hidden)
        tensors[f"{p}mlp.up_proj.weight"] = weight(intermediate, hidden)
        tensors[f"{p}mlp.down_proj.weight"] = weight(hidden, intermediate)
        tensors[f"{p}input_layernorm.weight"] = ones
        tensors[f"{p}post_attention_layernorm.weight"] = ones
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path
