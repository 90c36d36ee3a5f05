"""``token-producer``: the request's token ids for text requests (chat, string prompts, messages).

Type        ``token-producer`` (producer; ``tokenizer`` is its deprecated alias). Created with the
            estimate backend when a consumer needs ``TokenizedPrompt`` and none is configured, as
            llm-d does (not at all when every consumer needs exact ids).
Produces    ``TokenizedPrompt`` (``LLMRequest.tokenized``): little-endian uint32 ids per prompt,
            multimodal features sorted by offset, ``cache_salt``
Behaviour   idempotent: a body that already carries token ids is left alone (only ``cache_salt``
            is filled). Otherwise the backend tokenizes:
            ``local``     each model's ``tokenizer.json`` and chat template in process, exactly as
                          vLLM does (no network hop, shared prefixes tokenized once). The
                          tokenizer of a request's model is ``local.tokenizers[model]``, else
                          ``local.tokenizerPath``, else found offline in ``local.cacheDirs`` or
                          the Hugging Face hub cache (``HF_HUB_CACHE``, ``HF_HOME/hub``,
                          ``~/.cache/huggingface/hub``); else the request's engines render it
                          (vLLM ``--enable-scale-out``). With none of these the request is
                          routed by load: outcome ``no_tokenizer``, one warning per model
            ``vllm``      vLLM's render endpoints over HTTP (``/v1/chat/completions/render`` …),
                          bounded pool, timeouts, a circuit breaker
            ``estimate``  llm-d's byte packing: locality keys for the approximate and burst
                          producers only; the precise producer ignores them
            A request that cannot be tokenized is routed by load, with the reason counted
            (``ppc_extproc_tokenize_total{backend,outcome}``) and shown in ``/debug/decisions``.
            A chat template that fails on a request, or a request ``chat_template`` that is not
            trusted, is routed by load too (counted), never refused: the engine decides.
Parameters  ``modelName`` [""; the render server's served name, required for ``vllm``; with
            ``local``, the tokenizer used when the request's model has none],
            ``local.tokenizerPath`` (a Hugging Face model directory: ``tokenizer.json``,
            ``tokenizer_config.json``, ``chat_template.jinja``), ``local.tokenizers`` {model: dir},
            ``local.cacheDirs`` [], ``local.huggingFaceCache`` [true], ``local.engineRender``
            [true], ``local.chatTemplate`` (the engines' ``--chat-template`` file),
            ``local.defaultChatTemplateKwargs`` (``--default-chat-template-kwargs``),
            ``local.trustRequestChatTemplate`` [false] (``--trust-request-chat-template``),
            ``local.segmentCacheBytes`` [256 MiB], ``local.maxModels`` [256],
            ``local.maxLoadedTokenizers`` [8], ``vllm.url`` [http://localhost:8000; http or
            https], ``vllm.timeout`` ["5s"], ``vllm.mmTimeout`` ["30s"], ``vllm.maxConcurrency``
            [256], ``estimate.image.*``, ``estimate.video.*``; ``udsTokenizerConfig``
            (deprecated) loads as ``local`` with its ``modelTokenizerMap``. One backend at most.

    plugins:
    - type: token-producer
      parameters:
        local:
          tokenizers: {Qwen/Qwen3-8B: /models/Qwen3-8B}   # optional: the HF cache is read too
          defaultChatTemplateKwargs: {enable_thinking: false}
    - type: precise-prefix-cache-producer

Follows ``llm-d/llm-d-router: pkg/epp/framework/plugins/requestcontrol/dataproducer/tokenizer/``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import structlog

from ppc_extproc.errors import ConfigError
from ppc_extproc.framework import (
    TOKENIZED_PROMPT,
    AsyncDataProducer,
    Consumes,
    DataKey,
    Endpoint,
    Lifecycle,
    LLMRequest,
    PluginState,
    SchedulingContext,
    StateReporter,
)
from ppc_extproc.framework.params import Section
from ppc_extproc.plugins.producers.token_producer_config import (
    LocalConfig,
    TokenProducerConfig,
    parse_token_producer_config,
)
from ppc_extproc.plugins.registry import Services, register
from ppc_extproc.tokenizer import api_for_path
from ppc_extproc.tokenizer.engine_render import EngineRender
from ppc_extproc.tokenizer.estimate import EstimateConfig, estimate_body
from ppc_extproc.tokenizer.locate import TOKENIZER_FILE, TokenizerLocator
from ppc_extproc.tokenizer.models import ModelTokenizers, TokenizerOptions
from ppc_extproc.tokenizer.render_client import RenderClient, RenderConfig
from ppc_extproc.tokenizer.requests import Api
from ppc_extproc.tokenizer.result import MULTIMODAL_NEEDS_RENDER, NO_TOKENIZER, UNSUPPORTED_BODY, TokenizeResult
from ppc_extproc.tokenizer.segments import SegmentCache
from ppc_extproc.tokens import TokenizedPrompt
from ppc_extproc.tokens.body import json_object

__all__ = ["EstimateBackend", "LocalBackend", "RenderBackend", "TokenProducer", "TokenizeBackend"]

log = structlog.get_logger(__name__)


class TokenizeBackend(Protocol):
    """Turns a text request into token ids (``TokenizeResult.reason`` says why not)."""

    name: str
    #: Whether the ids are the engine's (False: locality estimates).
    exact: bool

    async def tokenize(
        self, api: Api, body: Mapping[str, Any], headers: Mapping[str, str], *, model: str = "",
        endpoints: Sequence[Endpoint] = (),
    ) -> TokenizeResult: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class LocalBackend:
    """Each model's tokenizer in process; what it cannot tokenize goes to ``render`` when given,
    and a model without a tokenizer on disk to ``render`` or, failing that, its engines."""

    name = "local"
    exact = True

    def __init__(
        self, tokenizers: ModelTokenizers, render: RenderBackend | None = None, engines: EngineRender | None = None,
        *, fallback_model: str = "",
    ) -> None:
        self.tokenizers = tokenizers
        self.render = render
        self.engines = engines
        #: ``modelName``: whose tokenizer a model without its own uses.
        self.fallback_model = fallback_model

    async def tokenize(
        self, api: Api, body: Mapping[str, Any], headers: Mapping[str, str], *, model: str = "",
        endpoints: Sequence[Endpoint] = (),
    ) -> TokenizeResult:
        tokenizer = await self.tokenizers.get(model) if model else self.tokenizers.default
        if tokenizer is None and self.fallback_model and self.fallback_model != model:
            tokenizer = await self.tokenizers.get(self.fallback_model)
        if tokenizer is not None:
            result = tokenizer.tokenize(api, body)  # BadRequestError for a malformed body
            if result.reason not in (MULTIMODAL_NEEDS_RENDER, UNSUPPORTED_BODY):
                return result
            if self.render is not None:
                return await self.render.tokenize(api, body, headers)
            if self.engines is not None and api != "responses":
                return await self.engines.render(api, body, _trace(headers), model, endpoints)
            return result
        if self.render is not None:
            return await self.render.tokenize(api, body, headers)
        if self.engines is not None:
            result = await self.engines.render(api, body, _trace(headers), model, endpoints)
            if result.ok:
                self.tokenizers.entry(model).source = "render"
            if result.ok or result.reason == "http_400":
                return result
            return TokenizeResult.failed(NO_TOKENIZER, result.detail, result.cache_salt)
        return TokenizeResult.failed(NO_TOKENIZER, "no tokenizer on disk and engineRender is off")

    async def start(self) -> None:
        if self.render is not None:
            await self.render.start()
        if self.engines is not None:
            await self.engines.start()

    async def stop(self) -> None:
        if self.render is not None:
            await self.render.stop()
        if self.engines is not None:
            await self.engines.stop()


class RenderBackend:
    """vLLM's render endpoints over HTTP (llm-d's ``vllm`` backend), behind a circuit breaker."""

    name = "vllm"
    exact = True

    def __init__(self, config: RenderConfig) -> None:
        self.client = RenderClient(config)

    async def tokenize(
        self, api: Api, body: Mapping[str, Any], headers: Mapping[str, str], *, model: str = "",
        endpoints: Sequence[Endpoint] = (),
    ) -> TokenizeResult:
        return await self.client.render(api, body, headers=_trace(headers))

    async def start(self) -> None:
        await self.client.start()

    async def stop(self) -> None:
        await self.client.close()


class EstimateBackend:
    """llm-d's byte packing: about 4 bytes per pseudo-token, content locality only."""

    name = "estimate"
    exact = False

    def __init__(self, config: EstimateConfig) -> None:
        self.config = config

    async def tokenize(
        self, api: Api, body: Mapping[str, Any], headers: Mapping[str, str], *, model: str = "",
        endpoints: Sequence[Endpoint] = (),
    ) -> TokenizeResult:
        return estimate_body(api, body, config=self.config, headers=headers)

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None


#: W3C trace context, propagated to the render server as llm-d does.
_TRACE_HEADERS = frozenset({"traceparent", "tracestate"})


def _trace(headers: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k in _TRACE_HEADERS}


def _model_tokenizers(local: LocalConfig, path: str, map_key: str = "tokenizers") -> ModelTokenizers:
    """The per-model table; the explicit directories are checked (and the default one loaded) now."""
    for model, directory in {"": local.tokenizer_path, **local.tokenizers}.items():
        if not directory:
            continue
        where = f"{path}.{map_key}.{model}" if model else f"{path}.tokenizerPath"
        d = Path(directory).expanduser()
        d = d.parent if d.name == TOKENIZER_FILE else d
        if not (d / TOKENIZER_FILE).is_file():
            raise ConfigError(where, f"{d} has no tokenizer.json (point it at the model directory vLLM serves from)")
    template = Path(local.chat_template_path).expanduser().read_text(encoding="utf-8") if local.chat_template_path else None
    options = TokenizerOptions(template, dict(local.default_chat_template_kwargs), local.trust_request_chat_template)
    locator = TokenizerLocator(local.tokenizer_path, dict(local.tokenizers), local.cache_dirs, hub=local.hf_cache)
    cache = SegmentCache(local.segment_cache_bytes) if local.segment_cache_bytes > 0 else None
    tokenizers = ModelTokenizers(locator, options=options, cache=cache, max_models=local.max_models,
                                 max_loaded=local.max_loaded)  # fmt: skip
    if local.tokenizer_path:
        try:
            tokenizers.default = tokenizers.load(local.tokenizer_path)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{path}.tokenizerPath", f"cannot load the tokenizer: {exc}") from None
    return tokenizers


def create_backend(config: TokenProducerConfig, path: str = "local", map_key: str = "tokenizers") -> TokenizeBackend:
    render = RenderBackend(config.render) if config.render is not None else None
    if config.local is not None:
        local = config.local
        engines = EngineRender() if local.engine_render else None
        return LocalBackend(_model_tokenizers(local, path, map_key), render, engines, fallback_model=config.model_name)
    if render is not None:
        return render
    return EstimateBackend(config.estimate)


@register("token-producer")
class TokenProducer(AsyncDataProducer, Lifecycle, StateReporter):
    def __init__(self, name: str, config: TokenProducerConfig, backend: TokenizeBackend | None = None) -> None:
        self.name = name
        self.config = config
        self.backend = backend or create_backend(config)
        render = config.render
        # The render clients bound each call themselves (and their breakers answer at once when open).
        self.produce_timeout_seconds: float | None = (
            max(render.timeout_seconds, render.mm_timeout_seconds) + 1.0 if render is not None else None
        )
        #: outcome → requests (``ok``, ``passthrough``, or the reason there are no tokens)
        self.outcomes: dict[str, int] = {}

    @classmethod
    def from_parameters(cls, name: str, params: Section, services: Services) -> TokenProducer:
        config = parse_token_producer_config(params)
        if config.backend == "estimate":
            params.warn(
                "", "the estimate backend packs about 4 bytes per pseudo-token: it defeats precise routing "
                "(the precise producer ignores its ids); set local: {} (tokenizers found per model) or vllm.url",
            )
        if params.has("udsTokenizerConfig") and not params.has("local") and config.local is not None:
            return cls(name, config, create_backend(config, params.child_path("udsTokenizerConfig"), "modelTokenizerMap"))
        return cls(name, config, create_backend(config, params.child_path("local")))

    @property
    def backend_name(self) -> str:
        return self.config.backend

    @property
    def exact(self) -> bool:
        """Whether this producer's ids are the engine's (not estimates)."""
        return self.backend.exact

    def produces(self) -> frozenset[DataKey[object]]:
        return frozenset({TOKENIZED_PROMPT.of(self.name)})

    def consumes(self) -> tuple[Consumes[object], ...]:
        return ()

    async def produce_async(self, ctx: SchedulingContext) -> None:
        request = ctx.request
        if request.tokenized is not None:  # token ids in the body: nothing to do
            self._count("passthrough")
            return
        started = time.perf_counter()
        outcome, detail = await self._tokenize(request, ctx.candidates)
        ctx.timings["tokenize"] = ctx.timings.get("tokenize", 0.0) + time.perf_counter() - started
        self._count(outcome)
        request.tokenize_outcome = f"{self.backend_name}:{outcome}"
        if detail:
            request.tokenize_detail = detail
        if isinstance(self.backend, LocalBackend) and request.model:
            entry = self.backend.tokenizers.entry(request.model)
            entry.count(outcome)
            if outcome == NO_TOKENIZER and not entry.warned:
                entry.warned = True
                log.warning(
                    "tokenizer_not_found", model=request.model, producer=self.name, detail=detail,
                    hint="requests of this model are routed by load: set local.tokenizers, mount the model's "
                    "tokenizer into the Hugging Face cache (HF_HUB_CACHE), or start the engines with --enable-scale-out",
                )

    async def _tokenize(self, request: LLMRequest, endpoints: Sequence[Endpoint]) -> tuple[str, str]:
        api = api_for_path(request.path)
        if api is None or not request.body:
            return "unsupported", ""
        body = request.body_json if request.body_json is not None else json_object(request.body)
        result = await self.backend.tokenize(api, body, request.headers, model=request.model, endpoints=endpoints)
        if result.reason is not None:
            if result.detail:
                log.debug("tokenize_failed", backend=self.backend_name, reason=result.reason, detail=result.detail)
            return result.reason, result.detail[:300]
        if not result.num_tokens():
            return "empty", ""
        request.tokenized = TokenizedPrompt(
            request.model, result.prompts, result.features, result.cache_salt, exact=self.backend.exact
        )
        return "ok", ""

    def _count(self, outcome: str) -> None:
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1

    async def start(self) -> None:
        await self.backend.start()

    async def stop(self) -> None:
        await self.backend.stop()

    def state(self, *, detailed: bool = False) -> PluginState:
        outcomes: Mapping[str, int] = dict(self.outcomes)
        details: dict[str, Any] = {"backend": self.backend_name, "outcomes": outcomes}
        if isinstance(self.backend, LocalBackend):
            details["models"] = self.backend.tokenizers.models()
        return PluginState(self.name, self.type_name, tokenize=(self.backend_name, outcomes), details=details)
