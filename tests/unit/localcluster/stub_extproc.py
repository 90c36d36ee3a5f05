"""Stand-in for ``ppc-extproc serve``: a minimal endpoint picker for testing the launcher and Envoy configs.

Run as a script with the same flags ``LocalCluster`` passes to the real service::

    python stub_extproc.py --grpc-port 9002 --admin-port 9003 --admin-address 127.0.0.1 \
        --endpoints 127.0.0.2:8000,127.0.0.3:8000 [--config-file F]

Routing: the request header ``x-stub-route`` (``ip:port`` or ``ip:port,ip:port``) if present, else
round-robin over ``--endpoints``. The request body mode is read from ``protocol_config``:

* ``FULL_DUPLEX_STREAMED``: hold the request headers until body end-of-stream, then send the
  headers response (``clear_route_cache``, destination, ``content-length``, ``envoy.lb``
  metadata) and echo the body as ``streamed_response`` chunks; response chunks are echoed too.
* ``BUFFERED``: answer request headers at once; route in the body response (header mutation).

Response headers get ``x-stub-served`` (``envoy.lb/x-gateway-destination-endpoint-served`` from
the response-path metadata, or ``-``) and ``x-stub-target``. gRPC health serves ``""``,
``liveness``, ``readiness`` and the ext_proc service name. The admin port answers ``/readyz``.
Not part of the shipped package.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import signal
from collections.abc import AsyncIterator
from typing import Any

import grpc
from aiohttp import web
from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from google.protobuf import struct_pb2
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

DEST = "x-gateway-destination-endpoint"
CHUNK = 62_000
FULL_DUPLEX = processing_mode_pb2.ProcessingMode.FULL_DUPLEX_STREAMED
BUFFERED = processing_mode_pb2.ProcessingMode.BUFFERED


def _header(key: str, value: str) -> base_pb2.HeaderValueOption:
    return base_pb2.HeaderValueOption(
        header=base_pb2.HeaderValue(key=key, raw_value=value.encode())
    )


def _headers(msg: pb.HttpHeaders) -> dict[str, str]:
    return {h.key: (h.raw_value.decode() if h.raw_value else h.value) for h in msg.headers.headers}


def _lb_metadata(target: str) -> struct_pb2.Struct:
    md = struct_pb2.Struct()
    md.update({"envoy.lb": {DEST: target}})
    return md


def _served(req: pb.ProcessingRequest) -> str:
    fields = req.metadata_context.filter_metadata.get("envoy.lb")
    if fields is None:
        return "-"
    value = fields.fields.get(DEST + "-served")
    return value.string_value if value is not None else "-"


class StubProcessor(pb_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    """Routes by ``x-stub-route`` or round-robin; echoes bodies as the protocol requires."""

    def __init__(self, endpoints: list[str]) -> None:
        self._rr = itertools.cycle(endpoints)

    def _pick(self, hdrs: dict[str, str]) -> str:
        return hdrs.get("x-stub-route") or next(self._rr)

    async def Process(  # gRPC method name
        self,
        request_iterator: AsyncIterator[pb.ProcessingRequest],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[pb.ProcessingResponse]:
        mode = FULL_DUPLEX
        hdrs: dict[str, str] = {}
        body = bytearray()
        target = ""
        async for req in request_iterator:
            if req.HasField("protocol_config"):
                mode = req.protocol_config.request_body_mode
            kind = req.WhichOneof("request")
            if kind == "request_headers":
                hdrs = _headers(req.request_headers)
                target = self._pick(hdrs)
                if req.request_headers.end_of_stream:
                    yield self._route_headers(target, None)
                elif mode != FULL_DUPLEX:
                    yield pb.ProcessingResponse(request_headers=pb.HeadersResponse())
            elif kind == "request_body":
                body += req.request_body.body
                if mode == FULL_DUPLEX:
                    if req.request_body.end_of_stream:
                        yield self._route_headers(target, len(body))
                        for resp in _chunks(bytes(body), response=False):
                            yield resp
                else:
                    common = pb.CommonResponse(
                        clear_route_cache=True,
                        header_mutation=pb.HeaderMutation(set_headers=[_header(DEST, target)]),
                    )
                    yield pb.ProcessingResponse(
                        request_body=pb.BodyResponse(response=common),
                        dynamic_metadata=_lb_metadata(target),
                    )
            elif kind == "request_trailers":
                yield pb.ProcessingResponse(request_trailers=pb.TrailersResponse())
            elif kind == "response_headers":
                mutation = pb.HeaderMutation(
                    set_headers=[
                        _header("x-stub-served", _served(req)),
                        _header("x-stub-target", target),
                    ]
                )
                yield pb.ProcessingResponse(
                    response_headers=pb.HeadersResponse(
                        response=pb.CommonResponse(header_mutation=mutation)
                    )
                )
            elif kind == "response_body":
                if mode == FULL_DUPLEX:
                    streamed = pb.StreamedBodyResponse(
                        body=req.response_body.body, end_of_stream=req.response_body.end_of_stream
                    )
                    yield pb.ProcessingResponse(
                        response_body=pb.BodyResponse(
                            response=pb.CommonResponse(
                                body_mutation=pb.BodyMutation(streamed_response=streamed)
                            )
                        )
                    )
                else:
                    yield pb.ProcessingResponse(response_body=pb.BodyResponse())
            elif kind == "response_trailers":
                yield pb.ProcessingResponse(response_trailers=pb.TrailersResponse())

    @staticmethod
    def _route_headers(target: str, body_len: int | None) -> pb.ProcessingResponse:
        sets = [_header(DEST, target)]
        if body_len:
            sets.append(_header("Content-Length", str(body_len)))
        common = pb.CommonResponse(
            clear_route_cache=True, header_mutation=pb.HeaderMutation(set_headers=sets)
        )
        return pb.ProcessingResponse(
            request_headers=pb.HeadersResponse(response=common),
            dynamic_metadata=_lb_metadata(target),
        )


def _chunks(body: bytes, *, response: bool) -> list[pb.ProcessingResponse]:
    pieces = [body[i : i + CHUNK] for i in range(0, len(body), CHUNK)] or [b""]
    out = []
    for i, piece in enumerate(pieces):
        streamed = pb.StreamedBodyResponse(body=piece, end_of_stream=i == len(pieces) - 1)
        body_resp = pb.BodyResponse(
            response=pb.CommonResponse(body_mutation=pb.BodyMutation(streamed_response=streamed))
        )
        out.append(
            pb.ProcessingResponse(response_body=body_resp)
            if response
            else pb.ProcessingResponse(request_body=body_resp)
        )
    return out


async def _main(args: argparse.Namespace) -> None:
    endpoints = [e for e in args.endpoints.split(",") if e]
    server = grpc.aio.server()
    pb_grpc.add_ExternalProcessorServicer_to_server(StubProcessor(endpoints), server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for name in ("", "liveness", "readiness", "envoy.service.ext_proc.v3.ExternalProcessor"):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    server.add_insecure_port(f"{args.grpc_address}:{args.grpc_port}")
    await server.start()

    async def ok(_request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/readyz", ok)
    app.router.add_get("/healthz", ok)
    runner = web.AppRunner(app)
    await runner.setup()
    if args.admin_port:
        await web.TCPSite(runner, args.admin_address, args.admin_port).start()

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"stub_extproc listening grpc={args.grpc_port} endpoints={endpoints}", flush=True)
    await stop.wait()
    await server.stop(0.5)
    await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--grpc-port", type=int, required=True)
    parser.add_argument("--grpc-address", default="127.0.0.1")
    parser.add_argument("--admin-port", type=int, default=0)
    parser.add_argument("--admin-address", default="127.0.0.1")
    parser.add_argument("--endpoints", default="")
    parser.add_argument("--config-file", default=None)
    args, _unknown = parser.parse_known_args()
    asyncio.run(_main(args))


if __name__ == "__main__":
    main()
