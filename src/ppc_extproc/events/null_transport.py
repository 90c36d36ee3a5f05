"""The KV-event transport's protocol and its null object (no ZMQ: importing this module loads no
socket library, so a producer holds a ``NullTransport`` until it starts a real one)."""

from __future__ import annotations

from concurrent.futures import Future
from typing import TYPE_CHECKING, Protocol

from ppc_extproc.events.apply import EventApplier
from ppc_extproc.events.stats import SourceState

if TYPE_CHECKING:
    from ppc_extproc.events.transport.source import EventEndpoint

__all__ = ["EventTransport", "NullTransport"]


class EventTransport(Protocol):
    """What the producer drives: lifecycle plus discovery's add/update/delete."""

    def start(self) -> None: ...

    def stop(self, timeout: float = 5.0) -> None: ...

    def add_endpoint(self, endpoint: EventEndpoint) -> Future[None]: ...

    def remove_endpoint(self, endpoint: EventEndpoint) -> Future[None]: ...

    def wait_idle(self, timeout: float = 5.0) -> bool: ...

    def flush(self) -> bool: ...

    def wait_flushed(self, timeout: float | None = None) -> bool: ...

    def sources(self) -> list[SourceState]: ...


def _done() -> Future[None]:
    future: Future[None] = Future()
    future.set_result(None)
    return future


class NullTransport:
    """No subscribers: deleted endpoints are cleared at once."""

    def __init__(self, applier: EventApplier) -> None:
        self.applier = applier

    def start(self) -> None:
        pass

    def stop(self, timeout: float = 5.0) -> None:
        pass

    def add_endpoint(self, endpoint: EventEndpoint) -> Future[None]:
        return _done()

    def remove_endpoint(self, endpoint: EventEndpoint) -> Future[None]:
        self.applier.remove_endpoint(endpoint.id)
        return _done()

    def wait_idle(self, timeout: float = 5.0) -> bool:
        return True

    def flush(self) -> bool:
        return False

    def wait_flushed(self, timeout: float | None = None) -> bool:
        return True

    def sources(self) -> list[SourceState]:
        return []
