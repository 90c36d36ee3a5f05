"""CPU of an ext_proc service while routed streams stay open, as a paced answer holds them: K
streams each send headers, the body (routed) and the response headers over a real gRPC channel,
then nothing for ``--seconds``; the service's CPU over that window, per second. ``serve`` with the
default configuration and 16 live mock engines (``LocalCluster`` without Envoy) next to the trivial
grpc.aio ext_proc (``_grpc_extproc.py``).

    python benchmarks/bench_open_streams.py [--seconds 10] [--streams 0,4,16]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import grpc
import orjson
from envoy.config.core.v3.base_pb2 import HeaderMap, HeaderValue

sys.path.insert(0, str(Path(__file__).parent))
from _common import header
from _grpc_extproc import _OPTIONS, _headers, pb, pb_grpc

from ppc_extproc_lab.localcluster import LocalCluster
from ppc_extproc_lab.localcluster.ports import free_port
from ppc_extproc_lab.workload.probes import tree_cpu_seconds as cpu_seconds


async def _held_cpu(address: str, pid: int, streams: int, seconds: float, body: bytes) -> float:
    """Cores ``pid`` uses while ``streams`` routed streams stay open."""
    async with grpc.aio.insecure_channel(address, options=_OPTIONS) as channel:
        await asyncio.wait_for(channel.channel_ready(), 30)
        stub = pb_grpc.ExternalProcessorStub(channel)
        held = []
        for _ in range(streams):
            queue: asyncio.Queue[pb.ProcessingRequest | None] = asyncio.Queue()

            async def outbound(queue: asyncio.Queue[pb.ProcessingRequest | None] = queue) -> AsyncIterator[pb.ProcessingRequest]:
                while (message := await queue.get()) is not None:
                    yield message

            call = stub.Process(outbound())
            config = pb.ProtocolConfiguration(request_body_mode=2, response_body_mode=0)  # BUFFERED, NONE
            await queue.put(pb.ProcessingRequest(request_headers=_headers("/v1/completions"), protocol_config=config))
            await asyncio.wait_for(call.read(), 30)
            await queue.put(pb.ProcessingRequest(request_body=pb.HttpBody(body=body, end_of_stream=True)))
            await asyncio.wait_for(call.read(), 30)
            status = HeaderMap(headers=[HeaderValue(key=":status", raw_value=b"200")])
            await queue.put(pb.ProcessingRequest(response_headers=pb.HttpHeaders(headers=status)))
            await asyncio.wait_for(call.read(), 30)
            held.append((queue, call))
        await asyncio.sleep(1.0)  # let the routing's own work finish
        before, started = cpu_seconds(pid), time.perf_counter()
        await asyncio.sleep(seconds)
        cores = (cpu_seconds(pid) - before) / (time.perf_counter() - started)
        for queue, call in held:
            await queue.put(pb.ProcessingRequest(response_trailers=pb.HttpTrailers()))
            await asyncio.wait_for(call.read(), 30)
            await queue.put(None)
            with contextlib.suppress(grpc.aio.AioRpcError):
                await asyncio.wait_for(call.read(), 30)
        return cores


def _rows(name: str, address: str, pid: int, counts: Sequence[int], seconds: float) -> None:
    body = orjson.dumps({"model": "mock-model", "prompt": list(range(1000)), "max_tokens": 16})
    for streams in counts:
        cores = asyncio.run(_held_cpu(address, pid, streams, seconds, body))
        print(f"{name:>18}  {streams:>7}  {cores * 1e3:16.2f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--streams", default="0,4,16")
    args = parser.parse_args()
    counts = [int(n) for n in args.streams.split(",") if n]
    header("bench_open_streams: service CPU while routed ext_proc streams stay open")
    print(f"{'server':>18}  {'streams':>7}  {'CPU ms per second':>16}   (CPU time has 10 ms resolution)")
    with LocalCluster(num_engines=16, engines_per_process=16, block_size=16, num_blocks=32768, with_envoy=False,
                      service_args=["--log-level", "warning"], startup_timeout=180) as cluster:  # fmt: skip
        assert cluster.service_process is not None
        _rows("ppc-extproc", f"127.0.0.1:{cluster.grpc_ports[0]}", cluster.service_process.pid or 0, counts, args.seconds)
    port = free_port()
    trivial = subprocess.Popen([sys.executable, str(Path(__file__).parent / "_grpc_extproc.py"), "trivial", str(port)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        _rows("trivial ext_proc", f"127.0.0.1:{port}", trivial.pid, counts, args.seconds)
    finally:
        trivial.terminate()
        trivial.wait(10)


if __name__ == "__main__":
    main()
