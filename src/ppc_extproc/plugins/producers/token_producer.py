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
from dataclasses import dataclass
from typing import Protocol

import structlog

from ppc_extproc.config.strict import Section
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
from ppc_extproc.plugins.producers.token_producer_config import TokenProducerConfig, parse_token_producer_config
from ppc_extproc.plugins.registry import Services, register
from ppc_extproc.tokens import TokenizedPrompt

__all__ = ["TokenProducer", "TokenizeBackend", "TokenizeOutcome"]

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class TokenizeOutcome:
    """A backend's answer: the ids, or why there are none (a metric label)."""

    tokenized: TokenizedPrompt | None
    #: ``ok``, or the reason: ``unsupported``, ``multimodal``, ``timeout``, ``http_<code>``, …
    outcome: str


class TokenizeBackend(Protocol):
    name: str

    async def tokenize(self, request: LLMRequest) -> TokenizeOutcome: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class _UnavailableBackend:
    """A backend this build cannot run (the request is routed by load, the reason counted)."""

    def __init__(self, name: str) -> None:
        self.name = name

    async def tokenize(self, request: LLMRequest) -> TokenizeOutcome:
        return TokenizeOutcome(None, "unavailable")

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None


def create_backend(config: TokenProducerConfig) -> TokenizeBackend:
    return _UnavailableBackend(config.backend)


@register("token-producer")
class TokenProducer(AsyncDataProducer, Lifecycle, StateReporter):
    def __init__(self, name: str, config: TokenProducerConfig, backend: TokenizeBackend | None = None) -> None:
        self.name = name
        self.config = config
        self.backend = backend or create_backend(config)
        render = config.render
        self.produce_timeout_seconds = (
            max(render.timeout_seconds, render.mm_timeout_seconds) if render is not None else None
        )
        #: outcome → requests
        self.outcomes: dict[str, int] = {}

    @classmethod
    def from_parameters(cls, name: str, params: Section, services: Services) -> TokenProducer:
        config = parse_token_producer_config(params)
        if config.backend == "estimate":
            params.warn(
                "", "the estimate backend packs about 4 bytes per pseudo-token: it defeats precise routing "
                "(the precise producer ignores its ids); set local.tokenizerPath (or vllm.url) for exact ids",
            )
        if name != "token-producer":
            params.warn("", f"token-producer named {name!r}: llm-d would also create an estimate 'token-producer'; "
                            "ppc-extproc uses this one for every consumer")  # fmt: skip
        return cls(name, config)

    @property
    def backend_name(self) -> str:
        return self.config.backend

    def produces(self) -> frozenset[DataKey]:
        return frozenset({DataKey(TOKENIZED_PROMPT, self.name)})

    def consumes(self) -> tuple[Consumes, ...]:
        return ()

    @property
    def exact(self) -> bool:
        """Whether this producer's ids are the engine's (not estimates)."""
        return self.config.backend != "estimate"

    async def produce_async(self, ctx: SchedulingContext) -> None:
        request = ctx.request
        if request.tokenized is not None:  # token ids in the body: nothing to do
            self._count("passthrough")
            return
        result = await self.backend.tokenize(request)
        self._count(result.outcome)
        request.tokenize_outcome = f"{self.backend_name}:{result.outcome}"
        if result.tokenized is not None and result.tokenized.num_tokens():
            request.tokenized = result.tokenized

    def _count(self, outcome: str) -> None:
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1

    async def start(self) -> None:
        await self.backend.start()

    async def stop(self) -> None:
        await self.backend.stop()

    def state(self, *, detailed: bool = False) -> PluginState:
        outcomes: Mapping[str, int] = dict(self.outcomes)
        return PluginState(self.name, self.type_name, details={"backend": self.backend_name, "outcomes": outcomes})
