"""Finding each model's tokenizer with no flag, the per-model table's bounds, the engine's chat
flags as options, and tokenization failures that route by load instead of refusing (no sockets)."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from epp_helpers import load
from structlog.testing import capture_logs

from ppc_extproc.errors import BadRequestError
from ppc_extproc.framework import Endpoint, LLMRequest, SchedulingContext
from ppc_extproc.plugins.producers.token_producer import TokenProducer
from ppc_extproc.tokenizer import LocalTokenizer
from ppc_extproc.tokenizer.locate import TokenizerLocator, hub_cache_dir, hub_snapshot
from ppc_extproc.tokenizer.models import ModelTokenizers
from ppc_extproc.tokenizer.requests import parse_chat

MESSAGES = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "What is a KV cache?"}]


def hub_with(root: Path, tiny_dir: Path, model: str, revision: str = "0123abc") -> Path:
    repo = root / ("models--" + model.replace("/", "--"))
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(revision + "\n")
    shutil.copytree(tiny_dir, repo / "snapshots" / revision)
    return root


# --- locating -----------------------------------------------------------------------------------


def test_hub_cache_dir_follows_huggingface_hub_precedence() -> None:
    assert hub_cache_dir({"HF_HUB_CACHE": "/a", "HF_HOME": "/b", "HOME": "/h"}) == Path("/a")
    assert hub_cache_dir({"HF_HOME": "/b", "HOME": "/h"}) == Path("/b/hub")
    assert hub_cache_dir({"HOME": "/h"}) == Path("/h/.cache/huggingface/hub")


def test_the_snapshot_is_the_one_refs_main_names(tmp_path: Path, tiny_dir: Path) -> None:
    hub = hub_with(tmp_path, tiny_dir, "Org/Model-1.5B")
    shutil.copytree(tiny_dir, tmp_path / "models--Org--Model-1.5B" / "snapshots" / "older")
    assert hub_snapshot(hub, "Org/Model-1.5B") == tmp_path / "models--Org--Model-1.5B" / "snapshots" / "0123abc"
    assert hub_snapshot(hub, "Org/Other") is None


@pytest.mark.parametrize("model", ["../etc", "a/../../b", "a/b/c", "/abs", "a--b", "", "x" * 200, "..", "a/.."])
def test_client_model_names_never_leave_the_cache(tmp_path: Path, tiny_dir: Path, model: str) -> None:
    hub_with(tmp_path / "hub", tiny_dir, "a/b")
    locator = TokenizerLocator(flat_caches=[str(tmp_path)], env={"HF_HUB_CACHE": str(tmp_path / "hub")})
    assert locator.find(model) is None


def test_explicit_paths_come_first_then_flat_caches_then_the_hub(tmp_path: Path, tiny_dir: Path) -> None:
    hub = hub_with(tmp_path / "hub", tiny_dir, "org/m")
    flat = tmp_path / "flat"
    shutil.copytree(tiny_dir, flat / "org" / "m")
    env = {"HF_HUB_CACHE": str(hub)}
    assert TokenizerLocator(env=env).find("org/m") == (hub / "models--org--m" / "snapshots" / "0123abc", "hf_cache")
    assert TokenizerLocator(flat_caches=[str(flat)], env=env).find("org/m") == (flat / "org" / "m", "cache")
    mapped = TokenizerLocator(per_model={"org/m": str(tiny_dir / "tokenizer.json")}, env=env)
    assert mapped.find("org/m") == (tiny_dir, "path")
    assert TokenizerLocator(default_path=str(tiny_dir), env=env).find("anything") == (tiny_dir, "path")
    assert TokenizerLocator(hub=False, env=env).find("org/m") is None


# --- the per-model table ------------------------------------------------------------------------------


def test_models_are_loaded_once_and_the_tables_stay_bounded(tmp_path: Path, tiny_dir: Path) -> None:
    hub = tmp_path / "hub"
    for i in range(3):
        hub_with(hub, tiny_dir, f"org/m{i}")
    now = [0.0]
    table = ModelTokenizers(
        TokenizerLocator(env={"HF_HUB_CACHE": str(hub)}), max_models=4, max_loaded=2, retry_seconds=30.0,
        clock=lambda: now[0],
    )  # fmt: skip

    async def scenario() -> None:
        first = await table.get("org/m0")
        assert first is not None and await table.get("org/m0") is first
        assert await table.get("org/m1") is not None and await table.get("org/m2") is not None
        assert sum(1 for m in table.models().values() if m["source"] == "hf_cache") == 3
        assert table.entry("org/m0").tokenizer is None  # the least recently used one was unloaded
        for i in range(10):
            assert await table.get(f"client/junk{i}") is None
        assert len(table.models()) == 4
        assert await table.get("late/model") is None
        hub_with(hub, tiny_dir, "late/model")
        assert await table.get("late/model") is None  # not looked up again within retry_seconds
        now[0] += 31.0
        assert await table.get("late/model") is not None  # a cache filled after start-up is found

    asyncio.run(scenario())


def test_concurrent_first_requests_share_one_load(tmp_path: Path, tiny_dir: Path) -> None:
    table = ModelTokenizers(TokenizerLocator(env={"HF_HUB_CACHE": str(hub_with(tmp_path, tiny_dir, "o/m"))}))
    loads = []
    original = table.load
    table.load = lambda d: loads.append(d) or original(d)  # type: ignore[method-assign]

    async def scenario() -> list[Any]:
        return list(await asyncio.gather(*(table.get("o/m") for _ in range(5))))

    got = asyncio.run(scenario())
    assert len(loads) == 1 and all(t is got[0] is not None for t in got)


# --- the engine's chat flags ---------------------------------------------------------------------------


def chat_ids(tok: LocalTokenizer, body: dict[str, Any]) -> list[int]:
    res = tok.tokenize_chat(parse_chat(body))
    assert res.ok, res.reason
    return np.frombuffer(res.prompts[0], dtype="<u4").tolist()  # type: ignore[no-any-return]


def test_the_engines_chat_template_replaces_the_models(tiny_dir: Path, tmp_path: Path) -> None:
    template = "{% for m in messages %}<|user|>{{ m['content'] }}{% endfor %}<|assistant|>"
    tok = LocalTokenizer.from_dir(tiny_dir, chat_template=template)
    plain = LocalTokenizer.from_dir(tiny_dir)
    expected = np.frombuffer(plain.encode("<|user|>Be terse.<|user|>What is a KV cache?<|assistant|>",
                                          add_special_tokens=False), dtype="<u4").tolist()  # fmt: skip
    assert chat_ids(tok, {"messages": MESSAGES}) == expected != chat_ids(plain, {"messages": MESSAGES})


def test_chat_template_kwargs_merge_as_vllm_does(tiny_dir: Path) -> None:
    template = "{{ messages[0]['content'] }}|thinking={{ enable_thinking }}|x={{ x }}"
    tok = LocalTokenizer.from_dir(tiny_dir, chat_template=template,
                                  default_chat_template_kwargs={"enable_thinking": False, "x": "d"})  # fmt: skip

    def rendered(**body: Any) -> str:
        return tok.render_chat(parse_chat({"messages": MESSAGES[:1], **body}))

    assert rendered() == "Be terse.|thinking=False|x=d"  # the configured default (Qwen3's enable_thinking: false)
    assert rendered(chat_template_kwargs={"enable_thinking": True}) == "Be terse.|thinking=True|x=d"  # body wins
    # vllm/renderers/params.py merge_kwargs: None and "auto" do not override a default
    assert rendered(chat_template_kwargs={"x": None, "enable_thinking": "auto"}) == "Be terse.|thinking=False|x=d"
    assert rendered(reasoning_effort="high") == "Be terse.|thinking=True|x=d"  # effort sets it over the default


def test_a_request_chat_template_is_used_only_when_trusted(tiny_dir: Path) -> None:
    body = {"messages": MESSAGES, "chat_template": "{{ messages[1]['content'] }}"}
    untrusted = LocalTokenizer.from_dir(tiny_dir).tokenize_chat(parse_chat(body))
    assert untrusted.reason == "untrusted_chat_template" and "--trust-request-chat-template" in untrusted.detail
    kwargs_body = {"messages": MESSAGES, "chat_template_kwargs": {"chat_template": "x"}}
    assert LocalTokenizer.from_dir(tiny_dir).tokenize_chat(parse_chat(kwargs_body)).reason == "untrusted_chat_template"
    trusted = LocalTokenizer.from_dir(tiny_dir, trust_request_chat_template=True)
    assert chat_ids(trusted, body) == np.frombuffer(trusted.encode("What is a KV cache?", add_special_tokens=False),
                                                    dtype="<u4").tolist()  # fmt: skip


def test_a_failing_template_is_a_reason_not_a_400(tiny_dir: Path) -> None:
    tok = LocalTokenizer.from_dir(tiny_dir, chat_template="{{ raise_exception('no system role') }}")
    result = tok.tokenize_chat(parse_chat({"messages": MESSAGES}))
    assert result.reason == "template_error" and "no system role" in result.detail
    with pytest.raises(BadRequestError, match=r"messages\[0\]\.role"):  # a malformed body still is one
        tok.tokenize("chat", {"messages": [{"content": "x"}]})


# --- the producer -------------------------------------------------------------------------------------


def producer(params: str) -> TokenProducer:
    plugin = load(f"plugins: [{{type: token-producer, parameters: {params}}}, {{type: max-score-picker}}]\n").plugins["token-producer"]
    assert isinstance(plugin, TokenProducer)
    return plugin


def produce(p: TokenProducer, model: str, body: dict[str, Any], path: str = "/v1/chat/completions") -> LLMRequest:
    request = LLMRequest("r", model, None, path, body=orjson.dumps({"model": model, **body}))
    asyncio.run(p.produce_async(SchedulingContext(request, [Endpoint("10.0.0.1", 8000)])))
    return request


def test_without_any_tokenizer_the_request_goes_by_load_counted_and_warned_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    p = producer("{local: {engineRender: false}}")
    with capture_logs() as logs:
        for _ in range(3):
            request = produce(p, "org/unknown", {"messages": MESSAGES})
            assert request.tokenized is None and request.tokenize_outcome == "local:no_tokenizer"
    warnings = [e for e in logs if e["event"] == "tokenizer_not_found"]
    assert len(warnings) == 1 and warnings[0]["log_level"] == "warning" and warnings[0]["model"] == "org/unknown"
    assert p.outcomes == {"no_tokenizer": 3}
    assert p.state().details["models"]["org/unknown"]["outcomes"] == {"no_tokenizer": 3}


def test_the_hf_cache_serves_the_requests_model(tmp_path: Path, tiny_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(hub_with(tmp_path, tiny_dir, "org/chat")))
    p = producer("{local: {}}")
    request = produce(p, "org/chat", {"messages": MESSAGES})
    reference = chat_ids(LocalTokenizer.from_dir(tiny_dir), {"messages": MESSAGES})
    assert request.tokenize_outcome == "local:ok" and request.prompt_tokens == len(reference)
    passthrough = LLMRequest("t", "org/chat", None, "/v1/completions", body=b'{"prompt":[1,2]}')
    from ppc_extproc.tokens import TokenizedPrompt

    passthrough.tokenized = TokenizedPrompt("org/chat", (b"\x01\x00\x00\x00",))
    asyncio.run(p.produce_async(SchedulingContext(passthrough, [])))
    assert p.outcomes == {"ok": 1, "passthrough": 1}


def test_legacy_tokenizer_configs_load_with_a_deprecation_and_still_tokenize(tiny_dir: Path) -> None:
    uds = load(
        f"plugins: [{{type: token-producer, parameters: {{modelName: m, udsTokenizerConfig: "
        f"{{socketFile: /tmp/t.sock, modelTokenizerMap: {{m: {str(tiny_dir / 'tokenizer.json')!r}}}}}}}}}, "
        "{type: max-score-picker}]\n"
    )
    assert any("DEPRECATION" in w and "udsTokenizerConfig" in w for w in uds.warnings)
    p = uds.plugins["token-producer"]
    assert isinstance(p, TokenProducer) and produce(p, "m", {"messages": MESSAGES}).tokenize_outcome == "local:ok"
    pool = load(
        "plugins: [{type: precise-prefix-cache-scorer, parameters: {indexerConfig: {tokenizersPoolConfig: "
        f"{{modelName: m, workersCount: 8, local: {{modelTokenizerMap: {{m: {str(tiny_dir)!r}}}}}}}}}}}}}, "
        "{type: max-score-picker}]\n"
    )
    assert any("DEPRECATION" in w and "tokenizersPoolConfig" in w for w in pool.warnings)
    q = pool.plugins["token-producer"]
    assert isinstance(q, TokenProducer) and q.backend_name == "local"
    assert produce(q, "m", {"messages": MESSAGES}).tokenize_outcome == "local:ok"


def test_the_embedded_default_runs_a_local_token_producer() -> None:
    from ppc_extproc.config.epp import load_config

    loaded = load_config(None)
    p = loaded.plugins["token-producer"]
    assert isinstance(p, TokenProducer) and p.backend_name == "local" and p.produce_timeout_seconds is None
    assert loaded.warnings == []
