"""``token-producer``: backend selection, parameter errors, and idempotence.

Ports the cases of ``llm-d/llm-d-router: pkg/epp/framework/plugins/requestcontrol/dataproducer/tokenizer/``
``tokenizer_test.go`` (``TestPluginFactory_Validation``, ``TestProduce_SkipsWhenAlreadyPopulated``)
and ``vllm_http_test.go`` (``TestPluginFactory_RejectsBothBackends``,
``TestPluginFactory_HTTPBackend_BadTimeout``), with ppc-extproc's ``local`` backend.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest
from epp_helpers import config_error, epp, load

from ppc_extproc.framework import Endpoint, LLMRequest, SchedulingContext
from ppc_extproc.plugins.producers.token_producer import TokenProducer
from ppc_extproc.tokens import TokenizedPrompt
from ppc_extproc.tokens.le32 import tokens_to_le32
from ppc_extproc_lab.tiny_tokenizer import build_tiny_tokenizer

UNREACHABLE = "http://127.0.0.1:9"  # never dialled: these tests open no sockets


def token_producer(params: str) -> TokenProducer:
    loaded = load(f"plugins: [{{type: token-producer, parameters: {params}}}, {{type: max-score-picker}}]\n")
    plugin = loaded.plugins["token-producer"]
    assert isinstance(plugin, TokenProducer)
    return plugin


def error_of(params: str) -> tuple[str, str]:
    error = config_error(epp(f"plugins: [{{type: token-producer, parameters: {params}}}]\n"))
    return error.path, error.message


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_tokenizer(tmp_path_factory.mktemp("tiny"))


# --- backend selection -----------------------------------------------------------------------------


def test_model_name_alone_selects_the_vllm_backend_with_llm_d_defaults() -> None:
    producer = token_producer("{modelName: Qwen/Qwen3-8B}")
    render = producer.config.render
    assert producer.backend_name == "vllm" and render is not None
    assert (render.model_name, render.url, render.timeout_seconds, render.mm_timeout_seconds) == (
        "Qwen/Qwen3-8B", "http://localhost:8000", 5.0, 30.0)  # fmt: skip
    assert producer.produce_timeout_seconds is not None and producer.produce_timeout_seconds >= 30.0


@pytest.mark.parametrize("params", ["{}", "null", "{estimate: {}}", "{udsTokenizerConfig: {socketFile: ''}}"])
def test_estimate_is_the_default_backend(params: str) -> None:
    producer = token_producer(params)
    assert producer.backend_name == "estimate" and not producer.exact
    assert producer.produce_timeout_seconds is None


def test_vllm_url_is_trimmed_and_timeouts_are_go_durations() -> None:
    producer = token_producer(f"{{modelName: m, vllm: {{url: '{UNREACHABLE}/', timeout: 1500ms, mmTimeout: 1m}}}}")
    render = producer.config.render
    assert render is not None and (render.url, render.timeout_seconds, render.mm_timeout_seconds) == (UNREACHABLE, 1.5, 60.0)


def test_local_backend_reads_the_tokenizer_directory(tiny_dir: Path) -> None:
    producer = token_producer(f"{{modelName: m, local: {{tokenizerPath: {str(tiny_dir)!r}}}}}")
    assert producer.backend_name == "local" and producer.exact and producer.config.render is None


def test_local_and_vllm_together_render_what_local_cannot(tiny_dir: Path) -> None:
    producer = token_producer(f"{{modelName: m, local: {{tokenizerPath: {str(tiny_dir)!r}}}, vllm: {{url: '{UNREACHABLE}'}}}}")
    assert producer.backend_name == "local" and producer.config.render is not None


@pytest.mark.parametrize(
    ("params", "path", "message"),
    [
        ("{vllm: {url: 'http://r:8000'}}", "plugins[0].parameters.modelName", "'modelName' must be specified"),
        ("{modelName: m, vllm: {timeout: 5 seconds}}", "plugins[0].parameters.vllm.timeout", "invalid 'timeout'"),
        ("{modelName: m, vllm: {mmTimeout: soon}}", "plugins[0].parameters.vllm.mmTimeout", "invalid 'mmTimeout'"),
        ("{modelName: m, vllm: {timeout: 0s}}", "plugins[0].parameters.vllm.timeout", "invalid 'timeout': must be positive"),
        ("{modelName: m, vllm: {url: 'ftp://r:8000'}}", "plugins[0].parameters.vllm.url", "http:// or https:// URL"),
        ("{modelName: m, estimate: {}, vllm: {}}", "plugins[0].parameters",
         "only one of 'estimate', 'vllm', or 'udsTokenizerConfig' may be set"),
        ("{modelName: m, udsTokenizerConfig: {socketFile: /tmp/t.sock}, vllm: {}}", "plugins[0].parameters",
         "only one of 'estimate', 'vllm', or 'udsTokenizerConfig' may be set"),
        ("{modelName: m, udsTokenizerConfig: {socketFile: /tmp/t.sock, useTCP: false, modelTokenizerMap: {m: /t}}}",
         "plugins[0].parameters.udsTokenizerConfig.modelTokenizerMap.m", "/t has no tokenizer.json"),
        ("{local: {tokenizers: {m: 3}}}", "plugins[0].parameters.local.tokenizers", "mapping of model name"),
        ("{local: {chatTemplate: /nonexistent.jinja}}", "plugins[0].parameters.local.chatTemplate", "no such file"),
        ("{local: {defaultChatTemplateKwargs: [1]}}", "plugins[0].parameters.local.defaultChatTemplateKwargs",
         "expected a mapping"),
        ("{local: {tokenizerPath: /t}, estimate: {}}", "plugins[0].parameters",
         "only one of 'estimate', 'vllm', or 'udsTokenizerConfig' may be set"),
        ("{estimate: {image: {mode: bogus}}}", "plugins[0].parameters.estimate.image.mode",
         'estimate.image.mode must be "dynamic" or "static"'),
        ("{estimate: {video: {frames: {mode: every}}}}", "plugins[0].parameters.estimate.video.frames.mode",
         'estimate.video.frames.mode must be "sampled" or "strided"'),
        ("{modelName: m, vllm: {bogus: 1}}", "plugins[0].parameters.vllm.bogus", "unknown key 'bogus'"),
    ],
)
def test_parameter_errors_name_the_field(params: str, path: str, message: str) -> None:
    got_path, got_message = error_of(params)
    assert got_path == path
    assert message in got_message


def test_local_needs_a_tokenizer_json(tmp_path: Path) -> None:
    path, message = error_of(f"{{local: {{tokenizerPath: {str(tmp_path)!r}}}}}")
    assert path == "plugins[0].parameters.local.tokenizerPath" and "has no tokenizer.json" in message


# --- idempotence -------------------------------------------------------------------------------------


def _produce(producer: TokenProducer, request: LLMRequest) -> LLMRequest:
    asyncio.run(producer.produce_async(SchedulingContext(request, [Endpoint("10.0.0.1", 8000)])))
    return request


@pytest.mark.parametrize("params", ["{}", f"{{modelName: m, vllm: {{url: '{UNREACHABLE}'}}}}"], ids=["estimate", "vllm"])
def test_a_request_with_token_ids_is_left_alone_and_counted_passthrough(params: str) -> None:
    producer = token_producer(params)
    tokenized = TokenizedPrompt("m", (tokens_to_le32([1, 2, 3, 4]),), cache_salt="s")
    body: dict[str, Any] = {"model": "m", "prompt": [1, 2, 3, 4], "cache_salt": "s"}
    request = _produce(producer, LLMRequest("r", "m", tokenized, body=orjson.dumps(body)))
    assert request.tokenized is tokenized
    assert producer.outcomes == {"passthrough": 1}
    assert producer.state().tokenize == (producer.backend_name, {"passthrough": 1})


def test_the_estimate_backend_tokenizes_a_text_prompt_into_locality_ids() -> None:
    producer = token_producer("{}")
    body = orjson.dumps({"model": "m", "prompt": "abcdefgh"})
    request = _produce(producer, LLMRequest("r", "m", None, body=body))
    assert request.tokenized is not None and not request.tokenized.exact
    assert request.tokenized.prompts == (b"abcdefgh",)  # 4 bytes per pseudo-token, as llm-d packs them
    assert producer.outcomes == {"ok": 1} and request.tokenize_outcome == "estimate:ok"


@pytest.mark.parametrize("params", ["{local: {}}", "{local: null}"])
def test_local_alone_finds_tokenizers_per_model(params: str) -> None:
    producer = token_producer(params)
    assert producer.backend_name == "local" and producer.exact and producer.produce_timeout_seconds is None


def test_vllm_url_may_be_https() -> None:
    producer = token_producer("{modelName: m, vllm: {url: 'https://render.example:8443/'}}")
    assert producer.config.render is not None and producer.config.render.url == "https://render.example:8443"
