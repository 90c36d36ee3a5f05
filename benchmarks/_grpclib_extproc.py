"""A trivial ext_proc on grpclib: pure-Python HTTP/2 (h2) on the process's own event loop, with none
of grpc C-core's threads. The benchmarks run it next to the trivial grpc.aio ext_proc
(``tests/unit/localcluster/stub_extproc.py``, ``_grpc_extproc.py trivial``) to tell what a paced
stream costs Python from what it costs grpcio.

    python benchmarks/_grpclib_extproc.py --grpc-port 9002 [--admin-port 9003] [--endpoints ip:port,…]

It takes ``LocalCluster``'s service flags (and ignores the rest), routes round robin over
``--endpoints`` in the request-body reply (BUFFERED, the shipped ``envoy.yaml``'s mode), answers
every other message with an empty reply, serves ``grpc.health.v1.Health/Check`` as SERVING for every
name, and ``/readyz`` on the admin port. It sets the allocator's thresholds as ``serve`` does.
Needs the ``bench`` extra (grpclib).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import signal
from collections.abc import Iterator

import hyperframe.frame
import uvloop
from aiohttp import web
from envoy.config.core.v3.base_pb2 import HeaderValue, HeaderValueOption
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from google.protobuf import struct_pb2
from grpc_health.v1 import health_pb2
from grpclib.const import Cardinality, Handler
from grpclib.server import Server, Stream
from h2.connection import H2Connection
from h2.settings import SettingCodes

from ppc_extproc.server.process import configure_malloc

DESTINATION = "x-gateway-destination-endpoint"


def tune_h2() -> None:
    """Two h2 defaults that cost a long prompt's body dearly.

    - h2 4.4.1 (``h2/connection.py``, ``_receive_frame``) logs every received frame with an eager
      ``repr(frame)``, and hyperframe 6.1.0's ``DataFrame`` repr (``_raw_data_repr``) hexlifies the
      whole payload before cutting it to 20 characters: 1.2 MB of hex per 600 KB body. The repr is
      replaced by the class name.
    - The server's SETTINGS_MAX_FRAME_SIZE stays at 16 KB, so Envoy cuts a 600 KB body into ~40
      DATA frames, each parsed in Python. It is raised to the protocol's maximum.
    """
    hyperframe.frame.Frame.__repr__ = lambda self: type(self).__name__  # type: ignore[method-assign]
    initiate = H2Connection.initiate_connection

    def initiate_with_large_frames(self: H2Connection) -> None:
        initiate(self)
        self.update_settings({SettingCodes.MAX_FRAME_SIZE: (1 << 24) - 1})

    H2Connection.initiate_connection = initiate_with_large_frames  # type: ignore[method-assign]


class TrivialExtProc:
    """Answers each ext_proc message; the body reply routes round robin."""

    def __init__(self, endpoints: list[str]) -> None:
        self._targets: Iterator[str] = itertools.cycle(endpoints)

    async def process(self, stream: Stream[pb.ProcessingRequest, pb.ProcessingResponse]) -> None:
        async for message in stream:
            kind = message.WhichOneof("request")
            if kind == "request_body":
                _ = message.request_body.body  # move the body out of the message, as any service must
                target = next(self._targets)
                mutation = pb.HeaderMutation(set_headers=[HeaderValueOption(header=HeaderValue(
                    key=DESTINATION, raw_value=target.encode()))])  # fmt: skip
                metadata = struct_pb2.Struct()
                metadata.update({"envoy.lb": {DESTINATION: target}})
                await stream.send_message(pb.ProcessingResponse(
                    request_body=pb.BodyResponse(response=pb.CommonResponse(header_mutation=mutation,
                                                                            clear_route_cache=True)),
                    dynamic_metadata=metadata))  # fmt: skip
            elif kind == "request_headers":
                await stream.send_message(pb.ProcessingResponse(request_headers=pb.HeadersResponse()))
            elif kind == "request_trailers":
                await stream.send_message(pb.ProcessingResponse(request_trailers=pb.TrailersResponse()))
            elif kind == "response_headers":
                await stream.send_message(pb.ProcessingResponse(response_headers=pb.HeadersResponse()))
            elif kind == "response_body":
                await stream.send_message(pb.ProcessingResponse(response_body=pb.BodyResponse()))
            elif kind == "response_trailers":
                await stream.send_message(pb.ProcessingResponse(response_trailers=pb.TrailersResponse()))

    @staticmethod
    async def check(stream: Stream[health_pb2.HealthCheckRequest, health_pb2.HealthCheckResponse]) -> None:
        await stream.recv_message()
        await stream.send_message(health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING))

    def __mapping__(self) -> dict[str, Handler]:
        return {
            "/envoy.service.ext_proc.v3.ExternalProcessor/Process": Handler(
                self.process, Cardinality.STREAM_STREAM, pb.ProcessingRequest, pb.ProcessingResponse),
            "/grpc.health.v1.Health/Check": Handler(
                self.check, Cardinality.UNARY_UNARY, health_pb2.HealthCheckRequest, health_pb2.HealthCheckResponse),
        }  # fmt: skip


async def serve(args: argparse.Namespace) -> None:
    endpoints = [e for e in args.endpoints.split(",") if e] or ["10.0.0.1:8000"]
    server = Server([TrivialExtProc(endpoints)])
    await server.start(args.grpc_address, args.grpc_port)
    runner = None
    if args.admin_port:
        async def ok(_request: web.Request) -> web.Response:
            return web.Response(text="ok")

        app = web.Application()
        app.router.add_get("/readyz", ok)
        app.router.add_get("/healthz", ok)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, args.admin_address, args.admin_port).start()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    print(f"grpclib trivial ext_proc on {args.grpc_address}:{args.grpc_port}", flush=True)
    try:
        await stop.wait()
    finally:
        server.close()
        await server.wait_closed()
        if runner is not None:
            await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--grpc-port", type=int, required=True)
    parser.add_argument("--grpc-address", default="127.0.0.1")
    parser.add_argument("--admin-port", type=int, default=0)
    parser.add_argument("--admin-address", default="127.0.0.1")
    parser.add_argument("--endpoints", default="")
    args, _unknown = parser.parse_known_args()  # LocalCluster also passes --config-file and service flags
    configure_malloc()
    tune_h2()
    uvloop.run(serve(args))


if __name__ == "__main__":
    main()
