"""Run the service in-process (its own event loop on a thread) and talk to it over real gRPC."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from envoy.config.core.v3.base_pb2 import HeaderMap, HeaderValue, Metadata
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc
from envoy.service.ext_proc.v3.external_processor_pb2 import (
    HttpBody,
    HttpHeaders,
    HttpTrailers,
    ProcessingRequest,
    ProcessingResponse,
    ProtocolConfiguration,
)
from google.protobuf.struct_pb2 import Struct

from ppc_extproc.scheduling.pool import parse_endpoint_list
from ppc_extproc.server.app import ServeOptions, Service, serve

FULL_DUPLEX = 4
BUFFERED = 2


@contextmanager
def running_service(tmp_path: Path, config: str | None = None, endpoints: str | None = "192.168.1.1:8000,192.168.1.2:8000,192.168.1.3:8000", **options: Any) -> Iterator[Service]:
    """The service on free ports; stopped (and its thread joined) when the block exits."""
    config_file = None
    if config is not None:
        config_file = tmp_path / "epp.yaml"
        config_file.write_text(config)
    serve_options = ServeOptions(
        config_file=str(config_file) if config_file else None, grpc_address="127.0.0.1", grpc_port=0,
        admin_port=0, endpoints=parse_endpoint_list(endpoints) if endpoints is not None else None, **options,
    )
    ready = threading.Event()
    state: dict[str, Any] = {}

    def run() -> None:
        async def main() -> None:
            state["loop"] = asyncio.get_running_loop()
            state["stop"] = asyncio.Event()
            await serve(
                serve_options, stop=state["stop"], install_signal_handlers=False,
                on_ready=lambda s: (state.update(service=s), ready.set()),
            )

        try:
            asyncio.run(main())
        except BaseException as exc:  # surfaced to the test below
            state["error"] = exc
        finally:
            ready.set()

    thread = threading.Thread(target=run, name="ppc-extproc-test-service", daemon=True)
    thread.start()
    try:
        ready.wait(30)
        if "service" not in state:
            raise RuntimeError(f"service did not start: {state.get('error')!r}")
        yield state["service"]
    finally:
        if "service" in state:
            state["service"].request_stop()
        elif "loop" in state and "stop" in state and not state["loop"].is_closed():
            state["loop"].call_soon_threadsafe(state["stop"].set)
        thread.join(30)
        assert not thread.is_alive(), "service thread did not stop"


@dataclass
class Client:
    """A real gRPC channel to the ext_proc port."""

    port: int
    channel: grpc.Channel = field(init=False)

    def __post_init__(self) -> None:
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.port}")
        self.stub = external_processor_pb2_grpc.ExternalProcessorStub(self.channel)

    def run(self, messages: Iterable[ProcessingRequest], timeout: float = 10.0) -> list[ProcessingResponse]:
        """Send every message, half-close, and collect every reply until the server ends the stream."""
        return list(self.stub.Process(iter(list(messages)), timeout=timeout))

    def close(self) -> None:
        self.channel.close()


def headers(path: str = "/v1/completions", method: str = "POST", eos: bool = False, extra: dict[str, str] | None = None,
            mode: int | None = FULL_DUPLEX, metadata: Metadata | None = None, response_mode: int | None = None) -> ProcessingRequest:
    values = {":path": path, ":method": method, ":authority": "gateway", ":scheme": "http", "hi": "mom",
              "content-type": "application/json", **(extra or {})}
    message = ProcessingRequest(
        request_headers=HttpHeaders(
            headers=HeaderMap(headers=[HeaderValue(key=k, raw_value=v.encode()) for k, v in values.items()]),
            end_of_stream=eos,
        )
    )
    if mode is not None:
        message.protocol_config.CopyFrom(ProtocolConfiguration(
            request_body_mode=mode, response_body_mode=response_mode if response_mode is not None else mode))
    if metadata is not None:
        message.metadata_context.CopyFrom(metadata)
    return message


def body(data: bytes, eos: bool = True, metadata: Metadata | None = None) -> ProcessingRequest:
    message = ProcessingRequest(request_body=HttpBody(body=data, end_of_stream=eos))
    if metadata is not None:
        message.metadata_context.CopyFrom(metadata)
    return message


def trailers() -> ProcessingRequest:
    return ProcessingRequest(request_trailers=HttpTrailers(trailers=HeaderMap()))


def response_headers(status: int = 200, content_type: str = "application/json", served: str | None = None,
                     upstream: bool = True) -> ProcessingRequest:
    """Response headers as Envoy sends them; ``upstream=False``: Envoy's own reply (no
    ``x-envoy-upstream-service-time``), as for a failed connect."""
    values = [
        HeaderValue(key=":status", raw_value=str(status).encode()),
        HeaderValue(key="content-type", raw_value=content_type.encode()),
    ]
    if upstream:
        values.append(HeaderValue(key="x-envoy-upstream-service-time", raw_value=b"3"))
    message = ProcessingRequest(response_headers=HttpHeaders(headers=HeaderMap(headers=values)))
    if served is not None:
        metadata = Metadata()
        metadata.filter_metadata["envoy.lb"].update({"x-gateway-destination-endpoint-served": served})
        message.metadata_context.CopyFrom(metadata)
    return message


def response_body(data: bytes, eos: bool = False) -> ProcessingRequest:
    return ProcessingRequest(response_body=HttpBody(body=data, end_of_stream=eos))


def subset_metadata(value: Any) -> Metadata:
    metadata = Metadata()
    struct = Struct()
    struct.update({"x-gateway-destination-endpoint-subset": value})
    metadata.filter_metadata["envoy.lb.subset_hint"].CopyFrom(struct)
    return metadata


def set_headers(reply: ProcessingResponse, which: str = "request_headers") -> dict[str, str]:
    common = getattr(reply, which).response
    return {h.header.key: h.header.raw_value.decode() for h in common.header_mutation.set_headers}


def metadata_destination(reply: ProcessingResponse) -> str:
    return reply.dynamic_metadata.fields["envoy.lb"].struct_value.fields["x-gateway-destination-endpoint"].string_value


def streamed_bodies(replies: list[ProcessingResponse], which: str = "request_body") -> list[tuple[bytes, bool]]:
    out = []
    for reply in replies:
        if reply.WhichOneof("response") == which:
            streamed = getattr(reply, which).response.body_mutation.streamed_response
            out.append((streamed.body, streamed.end_of_stream))
    return out
