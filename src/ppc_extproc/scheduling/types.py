"""What the scheduling pipeline works on: endpoints, the request, and per-request state."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from ppc_extproc.ids import EndpointId, endpoint_id
from ppc_extproc.matchinfo import PrefixCacheMatchInfo, best_match_info
from ppc_extproc.tokens import TokenizedPrompt

__all__ = ["Endpoint", "EndpointEvent", "EndpointEventKind", "LLMRequest", "SchedulingContext"]


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One serving endpoint (a vLLM pod, or one DP rank of it)."""

    address: str
    port: int
    name: str = ""
    #: Data-parallel rank index: KV events come from ``socketPort + rank``.
    rank: int = 0
    labels: tuple[tuple[str, str], ...] = ()
    #: ``ip:port`` (IPv6 unbracketed): the endpoint's key in the index and in every score map.
    id: EndpointId = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "id", endpoint_id(self.address, self.port))


class EndpointEventKind(enum.Enum):
    ADDED = "add"
    UPDATED = "update"
    DELETED = "delete"


@dataclass(frozen=True, slots=True)
class EndpointEvent:
    """Discovery's news about one endpoint; producers react in ``extract``."""

    kind: EndpointEventKind
    endpoint: Endpoint
    #: For UPDATED: the endpoint as it was before.
    previous: Endpoint | None = None


@dataclass(slots=True)
class LLMRequest:
    """One inference request as the scheduler sees it."""

    request_id: str
    #: Model after any rewrite; hashing uses it.
    model: str
    #: Token ids of the body; None for string prompts and chat (no prefix score).
    tokenized: TokenizedPrompt | None = None
    path: str = "/v1/completions"
    headers: dict[str, str] = field(default_factory=dict)
    #: Total prompt tokens, when known (in-flight token load).
    prompt_tokens: int = 0
    #: Block keys per prompt per producer, when computed ahead of scheduling (streamed bodies).
    precomputed_keys: dict[str, list[list[int]]] = field(default_factory=dict)


@dataclass(slots=True)
class SchedulingContext:
    """Per-request state shared by the plugins of one scheduling cycle."""

    request: LLMRequest
    candidates: list[Any]  # list[Endpoint]; typed loosely so tests can pass simple stand-ins
    #: endpoint id → attribute key → value (e.g. ``PrefixCacheMatchInfoDataKey/<producer>``)
    attributes: dict[EndpointId, dict[str, Any]] = field(default_factory=dict)
    #: plugin name → private per-request data (e.g. the producer's block keys for pre_request)
    plugin_data: dict[str, Any] = field(default_factory=dict)
    #: True for a dry run (debug scoring): no speculative seeding, no in-flight accounting.
    dry_run: bool = False
    #: stage → seconds, recorded by plugins that want their stages measured (keys, lookup)
    timings: dict[str, float] = field(default_factory=dict)

    def attribute(self, endpoint: EndpointId, key: str) -> Any:
        return self.attributes.get(endpoint, {}).get(key)

    @property
    def prompt_tokens(self) -> int:
        """Prompt tokens of the request: the parsed count, else the token ids it carries."""
        request = self.request
        if request.prompt_tokens > 0:
            return request.prompt_tokens
        return request.tokenized.num_tokens() if request.tokenized is not None else 0

    def match_info(self, endpoint: EndpointId, attribute_key: str | None = None) -> PrefixCacheMatchInfo | None:
        """The named producer's match info for ``endpoint``, or (no key) the best any producer wrote."""
        if attribute_key is not None:
            info = self.attribute(endpoint, attribute_key)
            return info if isinstance(info, PrefixCacheMatchInfo) else None
        return best_match_info(self.attributes.get(endpoint, {}).values())

    def uncached_tokens(self, endpoint: EndpointId, attribute_key: str | None = None) -> int:
        """Prompt tokens ``endpoint`` would have to prefill: the prompt minus its cached prefix."""
        info = self.match_info(endpoint, attribute_key)
        return max(0, self.prompt_tokens - (info.cached_tokens if info is not None else 0))

    def set_attribute(self, endpoint: EndpointId, key: str, value: Any) -> None:
        self.attributes.setdefault(endpoint, {})[key] = value
