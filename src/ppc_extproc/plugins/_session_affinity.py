"""What ``session-affinity-scorer`` and ``session-affinity-filter`` share: their parameters, the
two strategies and the binding table (llm-d: ``pkg/epp/framework/plugins/scheduling/util/
sessionaffinity/{header,session_id}.go``; each plugin instance has its own bindings, as there).

``encoded_endpoint_header`` (default, stateless): the request header (``x-session-token``) is
base64 (standard alphabet, padded) of the endpoint's identity — its name, llm-d's
``<namespace>/<pod>-rank-<i>``, or ``ip:port`` for an endpoint without one — and the response
carries the identity of the endpoint that served, for the client to echo.

``session_id`` (stateful): the session id comes from the first non-empty ``sources`` entry (a
header, or a request attribute such as ``agent-identity``); the binding is looked up before
scheduling (the store, when shared, answers in one round trip or not at all) and committed after
the pick; a new or moved binding reaches the store before the routing answer, so a session's next
turn finds it on any replica. A bound endpoint that is no longer a candidate (gone from discovery,
held down by health) expresses no preference — with ``placement: fewestBindings`` the session
goes to its rendezvous-hash endpoint among the candidates, the one every replica picks — and the
request's pick replaces the binding; so does the endpoint that actually served, when Envoy
retried elsewhere (``envoy-override-host.yaml``).
"""

from __future__ import annotations

import base64
import binascii
import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Self

from ppc_extproc.errors import ConfigError
from ppc_extproc.framework import (
    Consumes,
    DataKey,
    DataType,
    Endpoint,
    PluginState,
    ResponseInfo,
    SchedulingContext,
    SchedulingResult,
)
from ppc_extproc.framework.params import Section
from ppc_extproc.ids import EndpointId
from ppc_extproc.plugins.registry import Services
from ppc_extproc.scheduling.rendezvous import rendezvous, text_key
from ppc_extproc.sessions import BindingTable, SessionBindings, StoreConfig

__all__ = ["SessionAffinityConfig", "SessionAffinityCore", "SessionChoice", "SessionIdConfig", "SessionSource"]

ENCODED_ENDPOINT_HEADER = "encoded_endpoint_header"
SESSION_ID_STRATEGY = "session_id"
DEFAULT_TOKEN_HEADER = "x-session-token"
DEFAULT_SESSION_HEADER = "x-session-id"
PLACEMENTS = ("none", "fewestBindings")
_MAX_TOKEN_CHARS = 1024
_MAX_SOURCES = 16


@dataclass(frozen=True, slots=True)
class SessionSource:
    """Where a session id is read: a request header, or an attribute a producer wrote."""

    header: str = ""
    attribute: str = ""
    #: The attribute's producer; "" for producer-less keys such as ``agent-identity``.
    producer: str = ""

    @property
    def data_type(self) -> DataType[str]:
        return DataType(self.attribute)

    @property
    def key(self) -> DataKey[str]:
        return self.data_type.of(self.producer)


DEFAULT_SOURCES = (SessionSource(header=DEFAULT_SESSION_HEADER),)


@dataclass(frozen=True, slots=True)
class SessionIdConfig:
    """``sessionIdConfig`` (llm-d's keys, plus ppc-extproc's bounds, placement and store)."""

    sources: tuple[SessionSource, ...] = field(default_factory=lambda: DEFAULT_SOURCES)
    eviction_ttl_seconds: float = 300.0
    eviction_sweep_seconds: float = 10.0
    max_bindings: int = 65_536
    #: ``none`` (llm-d: an unbound session expresses no preference) or ``fewestBindings``.
    placement: str = "none"
    store: StoreConfig = field(default_factory=StoreConfig)


@dataclass(frozen=True, slots=True)
class SessionAffinityConfig:
    strategy: str = ENCODED_ENDPOINT_HEADER
    profile_name: str = ""
    #: ``encodedEndpointHeaderConfig.header``.
    token_header: str = DEFAULT_TOKEN_HEADER
    session_id: SessionIdConfig = field(default_factory=SessionIdConfig)


def _positive_or_default(section: Section, key: str, default: float) -> float:
    value = section.number(key, 0.0)
    if value < 0:
        raise ConfigError(section.child_path(key), f"must be > 0, got {value:g}")
    return value or default  # 0 (unset) takes the default, as llm-d's ApplyDefaults


def _sources(section: Section) -> tuple[SessionSource, ...]:
    sources: list[SessionSource] = []
    for path, item in section.items("sources"):
        entry = section.sub(item, path)
        source = SessionSource(
            header=entry.string("header", "").strip().lower(),
            attribute=entry.string("attribute", "").strip(),
            producer=entry.string("producer", "").strip(),
        )
        entry.finish()
        if bool(source.header) == bool(source.attribute):
            raise ConfigError(path, "exactly one of header or attribute must be set")
        sources.append(source)
    if len(sources) > _MAX_SOURCES:
        raise ConfigError(section.child_path("sources"), f"at most {_MAX_SOURCES} sources")
    return tuple(sources) or DEFAULT_SOURCES


def _store(section: Section) -> StoreConfig:
    default = StoreConfig()
    config = StoreConfig(
        address=section.string("address", ""),
        key_prefix=section.string("keyPrefix", default.key_prefix),
        timeout_seconds=section.number("timeoutMs", default.timeout_seconds * 1000, minimum=1, maximum=10_000) / 1000,
        failure_threshold=section.integer("failureThreshold", default.failure_threshold, minimum=1, maximum=1000),
        retry_seconds=section.number("retrySeconds", default.retry_seconds, minimum=0.01),
        max_pending_writes=section.integer("maxPendingWrites", default.max_pending_writes, minimum=1),
    )
    section.finish()
    if config.address and not config.address.startswith(("redis://", "rediss://", "unix://")):
        raise ConfigError(section.child_path("address"), f"expected redis://host:port, got {config.address!r}")
    if config.address and importlib.util.find_spec("redis") is None:
        raise ConfigError(section.child_path("address"),
                          "a shared store needs redis-py: pip install 'ppc-extproc[shared-state]'")
    return config


def decode_config(params: Section) -> SessionAffinityConfig:
    """The scorer's or filter's parameters; unknown keys are errors naming them."""
    strategy = params.string("strategy", ENCODED_ENDPOINT_HEADER, choices=(ENCODED_ENDPOINT_HEADER, SESSION_ID_STRATEGY))
    profile = params.string("profileName", "")
    encoded = params.section("encodedEndpointHeaderConfig")
    header = encoded.string("header", "").strip().lower() or DEFAULT_TOKEN_HEADER
    encoded.finish()
    section = params.section("sessionIdConfig")
    if params.has("sessionIdConfig") and strategy != SESSION_ID_STRATEGY:
        params.warn("sessionIdConfig", f"ignored: strategy is {strategy!r} (set strategy: session_id to use it)")
    session = SessionIdConfig(
        sources=_sources(section),
        eviction_ttl_seconds=_positive_or_default(section, "evictionTtlSeconds", 300.0),
        eviction_sweep_seconds=_positive_or_default(section, "evictionSweepSeconds", 10.0),
        max_bindings=section.integer("maxBindings", 65_536, minimum=1, maximum=10_000_000),
        placement=section.string("placement", "none", choices=PLACEMENTS),
        store=_store(section.section("sharedStore")),
    )
    section.finish()
    return SessionAffinityConfig(strategy, profile, header, session)


def encode_token(identity: str) -> str:
    """The ``x-session-token`` value naming an endpoint identity."""
    return base64.b64encode(identity.encode()).decode()


def decode_token(token: str) -> str:
    """The endpoint identity in a token, or "" when it is not valid base64 text."""
    if not token or len(token) > _MAX_TOKEN_CHARS:
        return ""
    try:
        return base64.b64decode(token, validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return ""


def identity(endpoint: Endpoint) -> str:
    """What a session token names: the endpoint's name (llm-d's id), else ``ip:port``."""
    return endpoint.name or endpoint.id


@dataclass(slots=True)
class SessionChoice:
    """One request's session, as the plugin saw it before scheduling (``SessionAffinity/<name>``)."""

    #: The session id (``session_id`` strategy); "" for a token.
    session: str
    #: The bound endpoint: ``ip:port`` (``session_id``) or the token's identity; None when unbound.
    bound: str | None
    #: Whether the bound endpoint was a candidate when the plugin ran (None: it did not run).
    present: bool | None = None
    #: What ``pre_request`` bound the session to.
    committed: EndpointId | None = None


SESSION_CHOICE: DataType[SessionChoice] = DataType("SessionAffinity")


def _spread(session: str, endpoints: Sequence[Endpoint]) -> EndpointId | None:
    """The session id's rendezvous-hash endpoint among ``endpoints``: the same on every replica,
    uniform over sessions; None when there are none."""
    return EndpointId(rendezvous(text_key(session), [e.id for e in endpoints])) if endpoints else None


class SessionAffinityCore:
    """One scorer's or filter's session logic; the plugin class adds its output (score or filter)."""

    def __init__(self, name: str, type_name: str, config: SessionAffinityConfig, services: Services) -> None:
        self.name = name
        self.type_name = type_name
        self.config = config
        self.choice_key = SESSION_CHOICE.of(name)
        self.clock = services.clock
        session = config.session_id
        self.bindings: SessionBindings | None = None
        if config.strategy == SESSION_ID_STRATEGY:
            table = BindingTable(max_bindings=session.max_bindings, ttl_seconds=session.eviction_ttl_seconds,
                                 clock=services.clock)  # fmt: skip
            self.bindings = SessionBindings(name, table, session.store, clock=services.clock)
        self._next_sweep = 0.0

    # -- data flow ----------------------------------------------------------------------------

    def consumes(self) -> tuple[Consumes[object], ...]:
        if self.bindings is None:
            return ()
        return tuple(Consumes(s.data_type, s.producer or None, required=False)
                     for s in self.config.session_id.sources if s.attribute)  # fmt: skip

    def produces(self) -> frozenset[DataKey[object]]:
        return frozenset({self.choice_key})

    def session_id(self, ctx: SchedulingContext) -> str:
        """The first non-empty source's value (trimmed), or ""."""
        for source in self.config.session_id.sources:
            value = ctx.request.headers.get(source.header, "") if source.header else ctx.get(source.key)
            if isinstance(value, str) and value.strip():
                return value.strip()
        return ""

    async def produce_async(self, ctx: SchedulingContext) -> None:
        if self.bindings is None:
            bound = decode_token(ctx.request.headers.get(self.config.token_header, ""))
            if bound:
                ctx.put(self.choice_key, SessionChoice("", bound))
            return
        session = self.session_id(ctx)
        if session:
            ctx.put(self.choice_key, SessionChoice(session, await self.bindings.lookup(session)))

    # -- scheduling ---------------------------------------------------------------------------

    def choose(self, ctx: SchedulingContext, endpoints: Sequence[Endpoint]) -> Endpoint | None:
        """The bound endpoint when it is a candidate (recording whether it was), else None."""
        choice = ctx.get(self.choice_key)
        if choice is None or choice.bound is None:
            return None
        if self.bindings is None:
            target = next((e for e in endpoints if identity(e) == choice.bound), None)
        else:
            target = next((e for e in endpoints if e.id == choice.bound), None)
        choice.present = target is not None
        return target

    def runner_up(self, ctx: SchedulingContext, bound: Endpoint, endpoints: Sequence[Endpoint]) -> EndpointId | None:
        """With ``fewestBindings``, where the session goes if ``bound`` fails: the session id's
        rendezvous-hash endpoint among the other candidates (the same on every replica, and
        uniform over sessions, so a dead pod's sessions do not herd onto one survivor)."""
        choice = ctx.get(self.choice_key)
        if self.config.session_id.placement != "fewestBindings" or choice is None or not choice.session:
            return None
        return _spread(choice.session, [e for e in endpoints if e.id != bound.id])

    def replacement(self, ctx: SchedulingContext, endpoints: Sequence[Endpoint]) -> EndpointId | None:
        """With ``fewestBindings``, where a session whose bound endpoint is gone goes: the session
        id's rendezvous-hash endpoint among the candidates, which is the runner-up Envoy fell back
        to while the endpoint was still listed. Every replica agrees on it without the store."""
        choice = ctx.get(self.choice_key)
        if (self.bindings is None or self.config.session_id.placement != "fewestBindings" or choice is None
                or choice.bound is None or choice.present is not False):  # fmt: skip
            return None
        return _spread(choice.session, endpoints)

    def placement_counts(self, ctx: SchedulingContext, endpoints: Sequence[Endpoint]) -> dict[EndpointId, int] | None:
        """Bindings per candidate, when a new session should go where fewest are."""
        if self.bindings is None or self.config.session_id.placement != "fewestBindings":
            return None
        if ctx.get(self.choice_key) is None:
            return None  # no session id: nothing to place
        table = self.bindings.table
        return {e.id: table.bindings_of(e.id) for e in endpoints}

    # -- after the pick -----------------------------------------------------------------------

    def _picked(self, result: SchedulingResult) -> EndpointId | None:
        profile = self.config.profile_name or result.primary_profile
        chosen = result.profile_results.get(profile)
        if chosen is None or not chosen.targets:
            return None
        return chosen.targets[0].id

    async def pre_request_async(self, ctx: SchedulingContext, result: SchedulingResult) -> None:
        """Bind the session to the pick; a new or moved binding reaches the shared store before
        the routing answer, so the session's next turn finds it on whichever replica it lands."""
        choice = ctx.get(self.choice_key)
        if self.bindings is None or choice is None or not choice.session:
            return
        picked = self._picked(result)
        if picked is None:
            return
        if choice.bound is None or choice.bound == picked:
            replacing = None
        elif choice.present is False:  # the bound endpoint is gone: the session moves
            replacing = EndpointId(choice.bound)
        else:
            return  # the bound endpoint was there and lost on score: the binding stays
        choice.committed = picked
        await self.bindings.commit_shared(choice.session, picked, replacing)

    def response_complete(self, ctx: SchedulingContext, info: ResponseInfo) -> None:
        """Envoy served the request elsewhere (a retry after a connection failure): follow it."""
        choice = ctx.get(self.choice_key)
        if (self.bindings is None or choice is None or choice.committed is None or info.failed
                or self.config.profile_name or info.endpoint == choice.committed):  # fmt: skip
            return
        self.bindings.commit(choice.session, info.endpoint, choice.committed)

    def response_headers(self, ctx: SchedulingContext, result: SchedulingResult,
                         served: EndpointId) -> list[tuple[str, str]]:  # fmt: skip
        """``encoded_endpoint_header``: the token of the endpoint that served (of the configured
        profile's pick, with ``profileName``)."""
        if self.bindings is not None:
            return []
        if self.config.profile_name:
            profile = result.profile_results.get(self.config.profile_name)
            targets = profile.targets if profile is not None else []
        else:
            targets = [t for t in result.targets if t.id == served] or result.targets[:1]
        return [(self.config.token_header, encode_token(identity(targets[0])))] if targets else []

    # -- service lifecycle --------------------------------------------------------------------

    async def start(self) -> None:
        if self.bindings is not None:
            await self.bindings.start()

    async def stop(self) -> None:
        if self.bindings is not None:
            await self.bindings.stop()

    def tick(self, now: float) -> None:
        if self.bindings is None or now < self._next_sweep:
            return
        self._next_sweep = now + self.config.session_id.eviction_sweep_seconds
        self.bindings.table.sweep()

    def state(self, *, detailed: bool = False) -> PluginState:
        details: dict[str, object] = {"strategy": self.config.strategy}
        if self.bindings is not None:
            table, stats = self.bindings.table, self.bindings.stats
            details.update({
                "bindings": len(table), "evicted": table.evicted, "expired": table.expired,
                "storeUp": self.bindings.store_up, "storeReads": stats.reads, "storeHits": stats.hits,
                "storeWrites": stats.writes, "storeAdopted": stats.adopted, "storeErrors": stats.errors,
                "storeDroppedWrites": stats.dropped_writes, "localFallbacks": stats.local_fallbacks,
            })
            if detailed:
                details["bindingsPerEndpoint"] = table.per_endpoint()
        return PluginState(self.name, self.type_name, details=details)



class SessionAffinityPlugin:
    """The roles the scorer and the filter share (lookup before scheduling, binding after the
    pick, the response's token, housekeeping, state), delegated to one ``SessionAffinityCore``;
    a subclass adds its output (``score`` or ``filter``) and names its ``TYPE_NAME``."""

    TYPE_NAME: ClassVar[str]
    #: The binding lookup bounds itself (``sharedStore.timeoutMs``) and never fails.
    produce_timeout_seconds: float | None = None

    def __init__(self, name: str, config: SessionAffinityConfig | None = None, services: Services | None = None) -> None:
        self.name = name
        self.core = SessionAffinityCore(name, self.TYPE_NAME, config or SessionAffinityConfig(), services or Services())

    @classmethod
    def from_parameters(cls, name: str, params: Section, services: Services) -> Self:
        return cls(name, decode_config(params), services)

    def consumes(self) -> tuple[Consumes[object], ...]:
        return self.core.consumes()

    def produces(self) -> frozenset[DataKey[object]]:
        return self.core.produces()

    async def produce_async(self, ctx: SchedulingContext) -> None:
        await self.core.produce_async(ctx)

    async def pre_request_async(self, ctx: SchedulingContext, result: SchedulingResult) -> None:
        await self.core.pre_request_async(ctx, result)

    def response_complete(self, ctx: SchedulingContext, info: ResponseInfo) -> None:
        self.core.response_complete(ctx, info)

    def response_headers(self, ctx: SchedulingContext, result: SchedulingResult, served: EndpointId) -> list[tuple[str, str]]:
        return self.core.response_headers(ctx, result, served)

    async def start(self) -> None:
        await self.core.start()

    async def stop(self) -> None:
        await self.core.stop()

    def tick(self, now: float) -> None:
        self.core.tick(now)

    def state(self, *, detailed: bool = False) -> PluginState:
        return self.core.state(detailed=detailed)
