"""The router: one request in, a decision out — the pure core the ext_proc servicer adapts.

    candidates (pool ∩ subset hint) → producers → profile (filters, scorers, picker)
    → destination ``ip:port[,ip:port]`` → pre_request hooks (speculative seeding, in-flight, LRU)
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog

from ppc_extproc.blockkeys import TokenProcessor
from ppc_extproc.errors import NoEndpointsError
from ppc_extproc.ids import EndpointId, destination_host_port
from ppc_extproc.plugins.base import ResponseInfo
from ppc_extproc.scheduling.inflight import InflightTracker
from ppc_extproc.scheduling.pool import EndpointPool
from ppc_extproc.scheduling.profile import ProfileResult, SchedulingProfile
from ppc_extproc.scheduling.types import Endpoint, LLMRequest, SchedulingContext
from ppc_extproc.tokens import TokenField, token_field_for_path

__all__ = ["Decision", "Router"]

log = structlog.get_logger(__name__)


@dataclass(slots=True)
class Decision:
    """Where a request goes and why."""

    targets: list[Endpoint]
    #: ``x-gateway-destination-endpoint`` value: ``ip:port`` or a comma-separated fallback list.
    destination: str
    ctx: SchedulingContext
    result: ProfileResult
    #: stage → seconds: produce, filter, score, pick, pre_request
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def primary(self) -> Endpoint:
        return self.targets[0]


class Router:
    """Runs the scheduling pipeline over the endpoint pool."""

    def __init__(
        self,
        pool: EndpointPool,
        producers: Sequence[Any],
        profile: SchedulingProfile,
        hooks: Sequence[Any] = (),
        inflight: InflightTracker | None = None,
    ) -> None:
        self.pool = pool
        self.producers = list(producers)
        self.profile = profile
        #: Plugins with ``pre_request`` / ``response_complete`` (producers and stateful scorers).
        self.hooks = list(hooks)
        #: Requests routed and not yet answered, per endpoint (read by load scorers).
        self.inflight = inflight if inflight is not None else InflightTracker()

    def route(
        self, request: LLMRequest, subset: Sequence[str] | None = None, *, dry_run: bool = False
    ) -> Decision:
        """Pick the destination for ``request``. Raises ``NoEndpointsError`` / ``SaturatedError``."""
        candidates = self.pool.candidates(subset)
        if not candidates:
            raise NoEndpointsError("failed to find endpoint candidates for serving the request")
        ctx = SchedulingContext(request, candidates, dry_run=dry_run)
        t0 = time.perf_counter()
        for producer in self.producers:
            try:
                producer.produce(ctx)
            except Exception:  # producer errors never fail the request (prefix score becomes 0)
                log.exception("producer_failed", producer=producer.name, request_id=request.request_id)
        t1 = time.perf_counter()
        result = self.profile.run(ctx, candidates)
        destination = ",".join(destination_host_port(e.id) for e in result.targets)
        t2 = time.perf_counter()
        if not dry_run:
            primary = result.targets[0]
            self.inflight.start(request.request_id, primary.id, ctx.uncached_tokens(primary.id))
            for hook in self.hooks:
                if hasattr(hook, "pre_request"):
                    try:
                        hook.pre_request(ctx, result.targets)
                    except Exception:
                        log.exception("pre_request_failed", plugin=hook.name)
        timings = {"produce": t1 - t0, **result.timings, "pre_request": time.perf_counter() - t2}
        return Decision(result.targets, destination, ctx, result, timings)

    def route_header_only(self, request: LLMRequest, subset: Sequence[str] | None = None) -> Endpoint:
        """A request without a body (``GET /v1/models``): any candidate, at random."""
        candidates = self.pool.candidates(subset)
        if not candidates:
            raise NoEndpointsError("failed to find endpoint candidates for serving the request")
        return random.choice(candidates)

    def response_complete(self, ctx: SchedulingContext, info: ResponseInfo) -> None:
        """The response ended (or the stream died): release per-request state in the plugins."""
        self.inflight.finish(ctx.request.request_id)
        for hook in self.hooks:
            if hasattr(hook, "response_complete"):
                try:
                    hook.response_complete(ctx, info)
                except Exception:
                    log.exception("response_complete_failed", plugin=hook.name)

    def streaming_token_field(self, path: str) -> TokenField | None:
        """The body field carrying token ids for ``path`` (None: no tokens to extract early)."""
        return token_field_for_path(path)

    def streaming_processor(self) -> tuple[str, TokenProcessor] | None:
        """The (producer name, token processor) whose block keys can be computed while the body
        streams in: the first producer that computes request keys from tokens."""
        for producer in self.producers:
            processor = getattr(producer, "processor", None)
            if isinstance(processor, TokenProcessor):
                return producer.name, processor
        return None

    def endpoint(self, endpoint_id: EndpointId) -> Endpoint | None:
        return next((e for e in self.pool.endpoints() if e.id == endpoint_id), None)
