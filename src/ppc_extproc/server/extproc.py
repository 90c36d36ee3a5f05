"""The ``envoy.service.ext_proc.v3.ExternalProcessor`` gRPC servicer: a thin adapter that feeds
each stream's messages to an ``ExtProcStream`` and sends back its replies."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

import grpc
import structlog
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc
from envoy.service.ext_proc.v3.external_processor_pb2 import ProcessingRequest, ProcessingResponse

from ppc_extproc.observability.metrics import Metrics
from ppc_extproc.scheduling.router import Router
from ppc_extproc.server.stream import ExtProcStream, StreamOptions
from ppc_extproc.server.usage import UsageSampler

__all__ = ["ExternalProcessor"]

log = structlog.get_logger(__name__)


class ExternalProcessor(external_processor_pb2_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    """One ``Process`` call per HTTP request; every call's state dies with the call."""

    def __init__(self, router: Router, options: StreamOptions, metrics: Metrics, decisions_kept: int = 256) -> None:
        self.router = router
        self.options = options
        self.metrics = metrics
        #: Streams open right now (graceful shutdown waits for them).
        self.active = 0
        #: The most recent routing decisions, newest last (``GET /debug/decisions``).
        self.recent_decisions: deque[dict[str, Any]] = deque(maxlen=decisions_kept)
        #: One sampler for every stream: which responses' usage is read when bodies are off.
        self.sampler = UsageSampler(options.usage_sample_rate)

    async def Process(
        self,
        request_iterator: AsyncIterator[ProcessingRequest],
        context: grpc.aio.ServicerContext[ProcessingRequest, ProcessingResponse],
    ) -> AsyncIterator[ProcessingResponse]:
        stream = ExtProcStream(self.router, self.options, self.metrics, self.recent_decisions.append, self.sampler,
                               defer_records=True)
        self.active += 1
        cancelled = True
        try:
            async for message in request_iterator:
                replies, close = await stream.handle(message)
                for reply in replies:
                    yield reply
                stream.run_deferred()  # the reply is on its way: record the decision now
                if close:
                    break
            cancelled = False
        except asyncio.CancelledError:
            raise
        except grpc.aio.AioRpcError:
            pass  # the peer reset the stream: nothing to answer
        finally:
            self.active -= 1
            stream.close(cancelled=cancelled)
            structlog.contextvars.clear_contextvars()
