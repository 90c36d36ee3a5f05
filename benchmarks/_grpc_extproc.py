"""Decision latency over a real gRPC channel, as Envoy sends requests with the shipped
``envoy/envoy.yaml`` (BUFFERED request body, no response body): headers, then the whole body in one
message; the time is from sending the body message to receiving its reply, client side, so it
includes moving the body both ways through gRPC.

The floor is a trivial grpc.aio ext_proc (``python benchmarks/_grpc_extproc.py trivial PORT``) that
reads each message and answers the body with a fixed destination header: what any Python
ext_proc pays to move the same request. It sets the allocator's thresholds as ``serve`` does
(``ppc_extproc.server.process.configure_malloc``) unless ``--glibc-malloc`` is given, and so does
the measuring client (Envoy, the real client, brings its own allocator).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import AsyncIterator, Sequence

import grpc
from envoy.config.core.v3.base_pb2 import HeaderMap, HeaderValue, HeaderValueOption
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from ppc_extproc.server.process import configure_malloc

__all__ = ["measure_grpc", "serve_trivial"]

_MAX_MESSAGE = 64 << 20
_OPTIONS = [("grpc.max_receive_message_length", _MAX_MESSAGE), ("grpc.max_send_message_length", _MAX_MESSAGE)]


def _headers(path: str, end_of_stream: bool = False) -> pb.HttpHeaders:
    return pb.HttpHeaders(end_of_stream=end_of_stream, headers=HeaderMap(headers=[
        HeaderValue(key=":path", raw_value=path.encode()), HeaderValue(key=":method", raw_value=b"POST"),
        HeaderValue(key="content-type", raw_value=b"application/json"),
        HeaderValue(key="content-length", raw_value=b"0"),
    ]))  # fmt: skip


async def _one(stub: pb_grpc.ExternalProcessorStub, body: bytes, path: str) -> float:
    """One request's ext_proc exchange; returns body-sent → body-reply seconds."""
    queue: asyncio.Queue[pb.ProcessingRequest | None] = asyncio.Queue()

    async def outbound() -> AsyncIterator[pb.ProcessingRequest]:
        while (message := await queue.get()) is not None:
            yield message

    call = stub.Process(outbound())
    config = pb.ProtocolConfiguration(request_body_mode=2, response_body_mode=0)  # BUFFERED, NONE
    await queue.put(pb.ProcessingRequest(request_headers=_headers(path), protocol_config=config))
    await call.read()
    message = pb.ProcessingRequest(request_body=pb.HttpBody(body=body, end_of_stream=True))
    started = time.perf_counter()
    await queue.put(message)
    reply = await call.read()
    elapsed = time.perf_counter() - started
    assert reply.WhichOneof("response") == "request_body", reply
    # The response as Envoy reports it with no response body: headers, then trailers; then close.
    status = HeaderMap(headers=[HeaderValue(key=":status", raw_value=b"200")])
    await queue.put(pb.ProcessingRequest(response_headers=pb.HttpHeaders(headers=status)))
    await call.read()
    await queue.put(pb.ProcessingRequest(response_trailers=pb.HttpTrailers()))
    await call.read()
    await queue.put(None)
    with contextlib.suppress(grpc.aio.AioRpcError):
        await call.read()
    return elapsed


async def _measure(address: str, bodies: Sequence[bytes], requests: int, path: str, warmup: int,
                   interval: float) -> list[float]:
    async with grpc.aio.insecure_channel(address, options=_OPTIONS) as channel:
        await asyncio.wait_for(channel.channel_ready(), 30)
        stub = pb_grpc.ExternalProcessorStub(channel)
        samples = []
        started = time.perf_counter()
        for i in range(requests + warmup):
            elapsed = await asyncio.wait_for(_one(stub, bodies[i % len(bodies)], path), 30)
            if i >= warmup:
                samples.append(elapsed)
            if interval:
                await asyncio.sleep(max(0.0, started + (i + 1) * interval - time.perf_counter()))
        return samples


def measure_grpc(address: str, bodies: Sequence[bytes], requests: int, path: str = "/v1/completions",
                 warmup: int = 10, interval: float = 0.0) -> list[float]:
    """Body → reply latencies (seconds) of ``requests`` sequential requests cycling ``bodies``,
    started at most one per ``interval`` seconds (0: back to back)."""
    configure_malloc()
    return asyncio.run(_measure(address, bodies, requests, path, warmup, interval))


class _Trivial(pb_grpc.ExternalProcessorServicer):
    async def Process(self, request_iterator, context):  # type: ignore[no-untyped-def]
        async for message in request_iterator:
            kind = message.WhichOneof("request")
            if kind == "request_body":
                _ = message.request_body.body  # move the body out of the message, as any service must
                mutation = pb.HeaderMutation(set_headers=[HeaderValueOption(header=HeaderValue(
                    key="x-gateway-destination-endpoint", raw_value=b"10.0.0.1:8000"))])  # fmt: skip
                yield pb.ProcessingResponse(request_body=pb.BodyResponse(response=pb.CommonResponse(
                    header_mutation=mutation, clear_route_cache=True)))  # fmt: skip
            elif kind == "request_headers":
                yield pb.ProcessingResponse(request_headers=pb.HeadersResponse())
            elif kind == "response_headers":
                yield pb.ProcessingResponse(response_headers=pb.HeadersResponse())
            elif kind == "response_trailers":
                yield pb.ProcessingResponse(response_trailers=pb.TrailersResponse())


async def serve_trivial(port: int) -> None:
    server = grpc.aio.server(options=_OPTIONS)
    pb_grpc.add_ExternalProcessorServicer_to_server(_Trivial(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


if __name__ == "__main__" and sys.argv[1:2] == ["trivial"]:
    if "--glibc-malloc" not in sys.argv:
        configure_malloc()
    try:
        import uvloop  # the same event loop as `serve` picks by default

        uvloop.run(serve_trivial(int(sys.argv[2])))
    except ImportError:
        asyncio.run(serve_trivial(int(sys.argv[2])))
