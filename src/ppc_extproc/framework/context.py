"""What one scheduling cycle works on: the request, per-request state, and the results.

    LLMRequest         the request as routing sees it (model, path, headers, body, token ids)
    SchedulingContext  per-request state the plugins share: candidates, typed per-request and
                       per-endpoint data (``get``, ``endpoint_value``)
    ProfileResult      one scheduling profile's targets and the numbers behind them
    SchedulingResult   the profile handler's verdict: targets, wire destinations, extra headers
    ResponseInfo       what the response path learned about a routed request
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, TypeVar, cast

from ppc_extproc.framework.datakeys import DataKey
from ppc_extproc.framework.endpoint import Endpoint
from ppc_extproc.ids import EndpointId, RequestKey
from ppc_extproc.matchinfo import PrefixCacheMatchInfo, best_match_info
from ppc_extproc.tokens import TokenizedPrompt

__all__ = [
    "PREFILL_FALLBACK_HEADER",
    "LLMRequest",
    "ProfileResult",
    "ResponseInfo",
    "SchedulingContext",
    "SchedulingResult",
    "StreamedKeys",
]

T = TypeVar("T")
_NO_VALUES: Mapping[EndpointId, object] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class StreamedKeys:
    """Block keys computed while a large body streamed in, by ``producer``'s token processor."""

    producer: str
    model: str
    #: Request keys of the (single) prompt's full blocks.
    keys: list[RequestKey]


@dataclass(slots=True)
class LLMRequest:
    """One inference request as the scheduler sees it."""

    request_id: str
    #: Model after any rewrite; hashing uses it.
    model: str
    #: Token ids: from the body (token-id prompts) or from a token producer; None until known.
    tokenized: TokenizedPrompt | None = None
    path: str = "/v1/completions"
    headers: dict[str, str] = field(default_factory=dict)
    #: The body as the engine will receive it (after any model rewrite); token producers read it.
    body: bytes = b""
    #: ``body`` as a JSON object when the request's one parse built it (token producers use it
    #: instead of parsing again); None: parse ``body`` if needed.
    body_json: dict[str, Any] | None = None
    #: Keys computed ahead of scheduling while the body streamed in (see ``StreamingKeyProducer``).
    streamed_keys: StreamedKeys | None = None
    #: ``<backend>:<outcome>`` of the token producer, when one ran (``/debug/decisions``).
    tokenize_outcome: str | None = None
    #: Why the token producer has no ids, when it says (``/debug/score``, ``/debug/decisions``).
    tokenize_detail: str | None = None

    @property
    def prompt_tokens(self) -> int:
        """Prompt tokens, when known (0 otherwise)."""
        return self.tokenized.num_tokens() if self.tokenized is not None else 0


@dataclass(slots=True)
class SchedulingContext:
    """Per-request state shared by the plugins of one scheduling cycle."""

    request: LLMRequest
    candidates: list[Endpoint]
    #: data key text → value: per-request data (``get``/``put``), producers' and plugins' own
    data: dict[str, object] = field(default_factory=dict)
    #: data key text → endpoint id → value (``endpoint_value``/``endpoint_values``): kept by key,
    #: so a plugin reads or writes a producer's value for every endpoint with one lookup
    endpoint_data: dict[str, dict[EndpointId, object]] = field(default_factory=dict)
    #: True for a dry run (debug scoring): no speculative seeding, no in-flight accounting.
    dry_run: bool = False
    #: stage → seconds, recorded by plugins that want their stages measured (keys, lookup)
    timings: dict[str, float] = field(default_factory=dict)
    #: ((extension point, plugin type, plugin name), seconds) per plugin call, in call order: llm-d's
    #: ``plugin_duration_seconds`` (``llm-d/llm-d-router: pkg/epp/metrics/metrics.go``).
    plugin_timings: list[tuple[tuple[str, str, str], float]] = field(default_factory=list)

    def plugin_time(self, point: str, type_name: str, name: str, seconds: float) -> None:
        """Record one plugin call's duration at ``point`` (``Filter``, ``Scorer``, ...)."""
        self.plugin_timings.append(((point, type_name or name, name), seconds))

    def get(self, key: DataKey[T]) -> T | None:
        """The request's value under ``key``, or None when its producer did not write one."""
        return cast("T | None", self.data.get(key.text))

    def put(self, key: DataKey[T], value: T) -> None:
        self.data[key.text] = value

    def pop(self, key: DataKey[T]) -> T | None:
        return cast("T | None", self.data.pop(key.text, None))

    def endpoint_value(self, endpoint: EndpointId, key: DataKey[T]) -> T | None:
        """``endpoint``'s value under ``key`` for this request, or None."""
        values = self.endpoint_data.get(key.text)
        return None if values is None else cast("T | None", values.get(endpoint))

    def endpoint_values(self, key: DataKey[T]) -> Mapping[EndpointId, T]:
        """Every endpoint's value under ``key`` (an endpoint without one is absent). Read-only."""
        return cast("Mapping[EndpointId, T]", self.endpoint_data.get(key.text, _NO_VALUES))

    def put_endpoint_value(self, endpoint: EndpointId, key: DataKey[T], value: T) -> None:
        self.endpoint_data.setdefault(key.text, {})[endpoint] = value

    def put_endpoint_values(self, key: DataKey[T], values: dict[EndpointId, T]) -> None:
        """``put_endpoint_value`` for several endpoints; ``values`` is kept, not copied."""
        column = self.endpoint_data.get(key.text)
        if column is None:
            self.endpoint_data[key.text] = cast("dict[EndpointId, object]", values)
        else:
            column.update(values)

    @property
    def prompt_tokens(self) -> int:
        return self.request.prompt_tokens

    def match_info(
        self, endpoint: EndpointId, key: DataKey[PrefixCacheMatchInfo] | None = None
    ) -> PrefixCacheMatchInfo | None:
        """The named producer's match info for ``endpoint``, or (no key) the best any producer wrote."""
        if key is not None:
            return self.endpoint_value(endpoint, key)
        return best_match_info(column[endpoint] for column in self.endpoint_data.values() if endpoint in column)

    def uncached_tokens(self, endpoint: EndpointId, key: DataKey[PrefixCacheMatchInfo] | None = None) -> int:
        """Prompt tokens ``endpoint`` would have to prefill: the prompt minus its cached prefix."""
        info = self.match_info(endpoint, key)
        return max(0, self.prompt_tokens - (info.cached_tokens if info is not None else 0))


@dataclass(slots=True)
class ProfileResult:
    """One profile's targets in preference order, with the numbers behind the choice."""

    targets: list[Endpoint]
    #: scorer name → endpoint → score (after clamping to [0, 1])
    scores: dict[str, dict[EndpointId, float]] = field(default_factory=dict)
    totals: dict[EndpointId, float] = field(default_factory=dict)
    #: stage → seconds (filter, score, pick)
    timings: dict[str, float] = field(default_factory=dict)


@dataclass(slots=True)
class SchedulingResult:
    """What the profile handler makes of the profiles' results."""

    primary_profile: str
    profile_results: Mapping[str, ProfileResult]
    #: Endpoints in preference order, by their index ids (``ip:rankPort``): match info,
    #: speculative entries and in-flight accounting use these.
    targets: list[Endpoint]
    #: ``ip:port`` per target as the data plane must dial it (a DP handler rewrites the port).
    destinations: list[EndpointId]
    #: Request headers to add for the data plane (e.g. ``x-data-parallel-host-port``); profile
    #: handlers and pre-request hooks append with ``add_header``.
    headers: list[tuple[str, str]] = field(default_factory=list)
    #: The endpoint that computes the prompt's KV and sends it to the primary target (the prefill
    #: pick under P/D disaggregation); None: the primary target prefills the prompt itself.
    kv_source: Endpoint | None = None
    #: Request headers the data plane must drop when nothing here sets them (a client must not
    #: choose the prefill endpoint of its own request).
    remove_headers: list[str] = field(default_factory=list)

    def add_header(self, name: str, value: str) -> None:
        """Set request header ``name`` (lower case) for the data plane, replacing an earlier value."""
        self.headers[:] = [(n, v) for n, v in self.headers if n != name]
        self.headers.append((name, value))

    @property
    def primary(self) -> ProfileResult:
        return self.profile_results[self.primary_profile]

    @classmethod
    def of(cls, targets: list[Endpoint], profile: str = "default") -> SchedulingResult:
        """A one-profile result whose destinations are the targets themselves."""
        return cls(profile, {profile: ProfileResult(targets)}, targets, [e.id for e in targets])


#: Response header a P/D sidecar sets when it prefilled a request locally because its prefill
#: leg failed; the value is the reason (the lab's sidecar with ``--prefill-fallback local``;
#: llm-d's sidecar has no fallback and relays the failure instead).
PREFILL_FALLBACK_HEADER = "x-prefill-fallback"


@dataclass(frozen=True, slots=True)
class ResponseInfo:
    """What the response path learned about a routed request."""

    request_id: str
    #: Endpoint that served (the served-endpoint metadata), or the first target.
    endpoint: EndpointId
    #: HTTP status of the upstream response; 0 when the stream ended before response headers.
    status: int = 200
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int | None = None
    #: Whether Envoy reached the engine: False for a connection-level failure Envoy reported
    #: (``response.flags`` UF/UC); None when unknown (no response headers, no attributes, or
    #: another local reply of Envoy's).
    reached: bool | None = True
    #: The data plane reset the stream before the response ended (client gone, upstream reset).
    cancelled: bool = False
    #: A P/D sidecar's ``x-prefill-fallback`` response header: it prefilled the request locally
    #: because the named prefiller failed (the value is its reason). None: no such header.
    prefill_fallback: str | None = None

    @property
    def failed(self) -> bool:
        """No successful answer: an error status, or a stream cancelled before any response.
        (A stream that simply ends without a response phase — Envoy configured not to send one —
        is not a failure.)"""
        return self.status >= 400 or (self.cancelled and self.status == 0)
