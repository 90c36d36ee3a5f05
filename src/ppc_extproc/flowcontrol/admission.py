"""Admission of one request, before scheduling: admitters, then flow control (gate on) or llm-d's
legacy rule (gate off: a sheddable request, priority < 0, is rejected with 429 while the pool's
saturation is ≥ 1.0) — ``llm-d/llm-d-router: pkg/epp/requestcontrol/admission.go``.

Identity (``pkg/epp/metadata/consts.go``): the flow is ``x-llm-d-inference-fairness-id`` (cut to
256 characters), else ``default-flow``; the priority is the request's InferenceObjective's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence

from ppc_extproc.errors import RequestError, SaturatedError
from ppc_extproc.flowcontrol.controller import FlowController, Ticket
from ppc_extproc.flowcontrol.types import (
    DEFAULT_FLOW,
    FAIRNESS_HEADER,
    SLO_TTFT_HEADERS,
    Admitter,
    FlowItem,
    SaturationDetector,
)
from ppc_extproc.ids import EndpointId

__all__ = ["MAX_FAIRNESS_ID_CHARS", "Admission", "AdmissionRejected", "fairness_id", "slo_ttft_seconds"]

MAX_FAIRNESS_ID_CHARS = 256


class AdmissionRejected(RequestError):
    """An admitter rejected the request (429, no dropped-reason header, as llm-d's admitters)."""

    status = 429
    error_class = "ResourceExhausted"


def fairness_id(headers: Mapping[str, str]) -> str:
    return headers.get(FAIRNESS_HEADER, "")[:MAX_FAIRNESS_ID_CHARS] or DEFAULT_FLOW


def slo_ttft_seconds(headers: Mapping[str, str]) -> float | None:
    """``x-llm-d-slo-ttft-ms`` (or its deprecated alias) in seconds; missing or invalid: None."""
    for name in SLO_TTFT_HEADERS:
        value = headers.get(name, "").strip()
        if value:
            try:
                ms = int(value)
            except ValueError:
                return None
            return ms / 1000.0
    return None


class Admission:
    """What every request passes before it is scheduled."""

    def __init__(
        self,
        endpoints: Callable[[], Sequence[EndpointId]],
        *,
        admitters: Sequence[Admitter] = (),
        controller: FlowController | None = None,
        detector: SaturationDetector | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._endpoints = endpoints
        self.admitters = tuple(admitters)
        self.controller = controller
        self.detector = detector
        self.clock = clock

    async def admit(self, request_id: str, headers: Mapping[str, str], priority: int, byte_size: int,
                    model: str, target_model: str, waited: float = 0.0) -> Ticket | None:  # fmt: skip
        """None (no flow control) or the dispatched request's ticket; raises ``RequestError``
        when the request is dropped. ``waited``: seconds since the request arrived."""
        if self.admitters:
            endpoints = self._endpoints()
            for admitter in self.admitters:
                reason = admitter.admit(priority, endpoints)
                if reason is not None:
                    raise AdmissionRejected(reason)
        controller = self.controller
        if controller is None:
            if priority < 0 and self.detector is not None and self.detector.saturation(self._endpoints(), {}, 0) >= 1.0:
                raise SaturatedError("system saturated, sheddable request dropped")
            return None
        now = self.clock()
        item = FlowItem(request_id, fairness_id(headers), priority, byte_size, now - waited, now,
                        controller.spec.default_ttl, slo_ttft_seconds(headers), model, target_model)  # fmt: skip
        return await controller.admit(item)
