"""A small, deterministic HF tokenizer directory built at run time (tests, the demo, the mock engine).

``build_tiny_tokenizer(dir)`` trains a byte-level BPE with the ``tokenizers`` trainer on a built-in
corpus and writes what a Hugging Face model directory holds for its tokenizer:

* ``tokenizer.json`` — added specials ``<|pad|>`` 0, ``<|bos|>`` 1, ``<|eos|>`` 2, ``<|user|>`` 3,
  ``<|assistant|>`` 4, ``<|system|>`` 5; post-processor ``<|bos|> $A``;
* ``tokenizer_config.json`` — ``bos_token``/``eos_token``/``pad_token``, ``tokenizer_class``;
* ``chat_template.jinja`` — ``{{ bos_token }}``, one role marker per message, ``<|eos|>`` after each,
  ``<|assistant|>`` as generation prompt; tools and tool calls printed with ``tojson`` so their
  key order reaches the ids.

No download, no shipped model; the same ``seed`` and ``vocab_size`` give byte-identical files.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

__all__ = ["SPECIAL_TOKENS", "TINY_CHAT_TEMPLATE", "build_tiny_tokenizer"]

#: Added special tokens, in id order.
SPECIAL_TOKENS = ("<|pad|>", "<|bos|>", "<|eos|>", "<|user|>", "<|assistant|>", "<|system|>")

TINY_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% if tools %}<|system|>Tools: {{ tools | tojson }}<|eos|>{% endif %}"
    "{% for m in messages %}"
    "{% if m['role'] == 'system' %}<|system|>"
    "{% elif m['role'] == 'assistant' %}<|assistant|>"
    "{% elif m['role'] == 'user' %}<|user|>"
    "{% else %}<|user|>[{{ m['role'] }}{% if m['tool_call_id'] is defined %} {{ m['tool_call_id'] }}{% endif %}] "
    "{% endif %}"
    "{% if m['content'] is string %}{{ m['content'] }}{% endif %}"
    "{% if m['tool_calls'] is defined %}{% for c in m['tool_calls'] %}"
    "<call>{{ c['function']['name'] }} {{ c['function']['arguments'] | tojson }}</call>"
    "{% endfor %}{% endif %}"
    "<|eos|>"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)

_WORD_TEXT = (
    "the a an of to in and is it that for on with as was at by be this from or have are not but what "
    "all were when we there can your which their said if do will each about how up out them then she "
    "many some so these would other into has more her two like him see time could no make than first "
    "been its who now people my made over did down only way find use may water long little very after "
    "words called just where most know get through back much before go good new write our used me man "
    "too any day same right look think also around another came come work three word must because does "
    "part even place well such here take why things help put years different away again off went old "
    "hello world cache prefix block token tokens model request router engine prompt system user "
    "assistant tool call weather city answer question terse KV vLLM Envoy pod latency throughput "
    "context conversation message reply function arguments json schema value key"
)
_WORDS = tuple(_WORD_TEXT.split())
_PUNCT = (".", ",", "?", "!", ":", ";", " -", "'s", "'t", "\n", "\n\n", "  ", " (", ")", '"', "{", "}", "[", "]")
_UNICODE = ("Zürich", "naïve", "café", "日本語", "😀", "Ελληνικά", "привет", "ß", "ñ", "→")


def _corpus(seed: int, sentences: int = 3000) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(sentences):
        n = rng.randint(3, 18)
        parts = []
        for _ in range(n):
            r = rng.random()
            if r < 0.04:
                parts.append(rng.choice(_UNICODE))
            elif r < 0.10:
                parts.append(str(rng.randint(0, 2048)))
            else:
                w = rng.choice(_WORDS)
                parts.append(w.capitalize() if rng.random() < 0.1 else w)
            if rng.random() < 0.15:
                parts[-1] += rng.choice(_PUNCT)
        out.append(" ".join(parts))
    return out


def build_tiny_tokenizer(directory: str | Path, *, vocab_size: int = 800, seed: int = 0) -> Path:
    """Write a tiny byte-level BPE tokenizer directory into ``directory``; returns its path."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(seed), trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<|bos|> $A", pair="<|bos|> $A <|bos|> $B", special_tokens=[("<|bos|>", 1)]
    )
    tok.save(str(path / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|bos|>",
        "eos_token": "<|eos|>",
        "pad_token": "<|pad|>",
        "model_max_length": 1_000_000,
        "clean_up_tokenization_spaces": False,
    }
    (path / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    (path / "chat_template.jinja").write_text(TINY_CHAT_TEMPLATE, encoding="utf-8")
    return path
