"""``token-producer``: the request's token ids for text requests (chat, string prompts, messages).

Type        ``token-producer`` (producer; ``tokenizer`` is its deprecated alias). Created with the
            estimate backend when a consumer needs ``TokenizedPrompt`` and none is configured, as
            llm-d does (not at all when every consumer needs exact ids).
Produces    ``TokenizedPrompt`` (``LLMRequest.tokenized``): little-endian uint32 ids per prompt,
            multimodal features sorted by offset, ``cache_salt``
Behaviour   idempotent: a body that already carries token ids is left alone (only ``cache_salt``
            is filled). Otherwise the backend tokenizes:
            ``local``     the model's ``tokenizer.json`` and chat template in process, exactly as
                          vLLM does (recommended: no network hop, shared prefixes tokenized once)
            ``vllm``      vLLM's render endpoints over HTTP (``/v1/chat/completions/render`` …),
                          bounded pool, timeouts, a circuit breaker
            ``estimate``  llm-d's byte packing: locality keys for the approximate and burst
                          producers only; the precise producer ignores them
            A request that cannot be tokenized is routed by load, with the reason counted
            (``ppc_extproc_tokenize_total{backend,outcome}``) and shown in ``/debug/decisions``.
Parameters  ``modelName`` [""; the render server's served name, required for ``vllm``],
            ``local.tokenizerPath`` (a Hugging Face model directory: ``tokenizer.json``,
            ``tokenizer_config.json``, ``chat_template.jinja``), ``local.segmentCacheBytes``
            [256 MiB], ``vllm.url`` [http://localhost:8000], ``vllm.timeout`` ["5s"],
            ``vllm.mmTimeout`` ["30s"], ``vllm.maxConcurrency`` [64], ``estimate.image.*``,
            ``estimate.video.*``; ``udsTokenizerConfig`` is refused. One backend at most.

    plugins:
    - type: token-producer
      parameters:
        modelName: Qwen/Qwen3-8B
        local: {tokenizerPath: /models/Qwen3-8B}
    - type: precise-prefix-cache-producer

Follows ``llm-d/llm-d-router: pkg/epp/framework/plugins/requestcontrol/dataproducer/tokenizer/``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import orjson
import structlog

from ppc_extproc.errors import BadRequestError, ConfigError
from ppc_extproc.framework import (
    TOKENIZED_PROMPT,
    AsyncDataProducer,
    Consumes,
    DataKey,
    Lifecycle,
    LLMRequest,
    PluginState,
    SchedulingContext,
    StateReporter,
)
from ppc_extproc.framework.params import Section
from ppc_extproc.plugins.producers.token_producer_config import TokenProducerConfig, parse_token_producer_config
from ppc_extproc.plugins.registry import Services, register
from ppc_extproc.tokenizer import LocalTokenizer, api_for_path
from ppc_extproc.tokenizer.estimate import EstimateConfig, estimate_body
from ppc_extproc.tokenizer.render_client import RenderClient, RenderConfig
from ppc_extproc.tokenizer.requests import Api
from ppc_extproc.tokenizer.result import MULTIMODAL_NEEDS_RENDER, UNSUPPORTED_BODY, TokenizeResult
from ppc_extproc.tokens import TokenizedPrompt

__all__ = ["EstimateBackend", "LocalBackend", "RenderBackend", "TokenProducer", "TokenizeBackend"]

log = structlog.get_logger(__name__)


class TokenizeBackend(Protocol):
    """Turns a text request into token ids (``TokenizeResult.reason`` says why not)."""

    name: str
    #: Whether the ids are the engine's (False: locality estimates).
    exact: bool

    async def tokenize(self, api: Api, body: Mapping[str, Any], headers: Mapping[str, str]) -> TokenizeResult: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class LocalBackend:
    """The model's tokenizer in process; what it cannot tokenize goes to ``render`` when given."""

    name = "local"
    exact = True

    def __init__(self, tokenizer: LocalTokenizer, render: RenderBackend | None = None) -> None:
        self.tokenizer = tokenizer
        self.render = render

    async def tokenize(self, api: Api, body: Mapping[str, Any], headers: Mapping[str, str]) -> TokenizeResult:
        result = self.tokenizer.tokenize(api, body)  # BadRequestError for a malformed body
        if result.reason in (MULTIMODAL_NEEDS_RENDER, UNSUPPORTED_BODY) and self.render is not None:
            return await self.render.tokenize(api, body, headers)
        return result

    async def start(self) -> None:
        if self.render is not None:
            await self.render.start()

    async def stop(self) -> None:
        if self.render is not None:
            await self.render.stop()


class RenderBackend:
    """vLLM's render endpoints over HTTP (llm-d's ``vllm`` backend), behind a circuit breaker."""

    name = "vllm"
    exact = True

    def __init__(self, config: RenderConfig) -> None:
        self.client = RenderClient(config)

    async def tokenize(self, api: Api, body: Mapping[str, Any], headers: Mapping[str, str]) -> TokenizeResult:
        forwarded = {k: v for k, v in headers.items() if k in _TRACE_HEADERS}
        return await self.client.render(api, body, headers=forwarded)

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

    async def tokenize(self, api: Api, body: Mapping[str, Any], headers: Mapping[str, str]) -> TokenizeResult:
        return estimate_body(api, body, config=self.config, headers=headers)

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None


#: W3C trace context, propagated to the render server as llm-d does.
_TRACE_HEADERS = frozenset({"traceparent", "tracestate"})


def create_backend(config: TokenProducerConfig) -> TokenizeBackend:
    render = RenderBackend(config.render) if config.render is not None else None
    if config.local is not None:
        tokenizer = LocalTokenizer.from_dir(config.local.tokenizer_path, cache_bytes=config.local.segment_cache_bytes)
        return LocalBackend(tokenizer, render)
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
        # The render client bounds each call itself (and its breaker answers at once when open).
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
                "(the precise producer ignores its ids); set local.tokenizerPath (or vllm.url) for exact ids",
            )
        if config.local is not None:
            directory = Path(config.local.tokenizer_path)
            if not (directory / "tokenizer.json").is_file():
                raise ConfigError(
                    params.child_path("local.tokenizerPath"),
                    f"{directory} has no tokenizer.json (point it at the model directory vLLM serves from)",
                )
            try:
                backend: TokenizeBackend = create_backend(config)
            except (OSError, ValueError) as exc:
                raise ConfigError(params.child_path("local.tokenizerPath"), f"cannot load the tokenizer: {exc}") from None
            return cls(name, config, backend)
        return cls(name, config)

    @property
    def backend_name(self) -> str:
        return self.config.backend

    @property
    def exact(self) -> bool:
        """Whether this producer's ids are the engine's (not estimates)."""
        return self.backend.exact

    def produces(self) -> frozenset[DataKey]:
        return frozenset({DataKey(TOKENIZED_PROMPT, self.name)})

    def consumes(self) -> tuple[Consumes, ...]:
        return ()

    async def produce_async(self, ctx: SchedulingContext) -> None:
        request = ctx.request
        if request.tokenized is not None:  # token ids in the body: nothing to do
            self._count("passthrough")
            return
        outcome = await self._tokenize(request)
        self._count(outcome)
        request.tokenize_outcome = f"{self.backend_name}:{outcome}"

    async def _tokenize(self, request: LLMRequest) -> str:
        api = api_for_path(request.path)
        if api is None or not request.body:
            return "unsupported"
        try:
            body = orjson.loads(request.body)
        except orjson.JSONDecodeError as exc:
            raise BadRequestError(f"error unmarshaling request body: {exc}") from None
        if not isinstance(body, dict):
            raise BadRequestError("request body must be a JSON object")
        result = await self.backend.tokenize(api, body, request.headers)
        if result.reason is not None:
            if result.detail:
                log.debug("tokenize_failed", backend=self.backend_name, reason=result.reason, detail=result.detail)
            return result.reason
        if not result.num_tokens():
            return "empty"
        request.tokenized = TokenizedPrompt(
            request.model, result.prompts, result.features, result.cache_salt, exact=self.backend.exact
        )
        return "ok"

    def _count(self, outcome: str) -> None:
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1

    async def start(self) -> None:
        await self.backend.start()

    async def stop(self) -> None:
        await self.backend.stop()

    def state(self, *, detailed: bool = False) -> PluginState:
        outcomes: Mapping[str, int] = dict(self.outcomes)
        return PluginState(
            self.name, self.type_name, tokenize=(self.backend_name, outcomes),
            details={"backend": self.backend_name, "outcomes": outcomes},
        )
