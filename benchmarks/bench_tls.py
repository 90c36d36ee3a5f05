"""What TLS on the ext_proc port costs per small request, next to plaintext, over real gRPC channels.

Two ``ppc-extproc serve`` processes with the same static endpoints and the embedded default
configuration: one plaintext, one with ``--secure-serving`` (TLS 1.3, the self-signed certificate
made at start, as under llm-d's chart). One long-lived channel to each (Envoy keeps its ext_proc
connection open), then rounds that alternate between them, each round ``--requests`` sequential
streams of one small completion (64 token ids) as Envoy sends it (headers, then the body in
FULL_DUPLEX_STREAMED; the stream ends after the routed reply). Reported per request: client
wall-clock latency and the server process's CPU (utime + stime from /proc). Then the cost of a new
connection (the TLS handshake) next to a plaintext connect, ``--connects`` times each.

    python benchmarks/bench_tls.py [--requests 2000] [--rounds 5] [--connects 50]

The machine is shared: compare the two columns of one run (ratios), not absolute figures.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import socket
import ssl
import subprocess
import sys
import time
from typing import Any

import grpc
import orjson
from envoy.config.core.v3.base_pb2 import HeaderMap, HeaderValue
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc
from envoy.service.ext_proc.v3.external_processor_pb2 import HttpBody, HttpHeaders, ProcessingRequest
from grpc_health.v1 import health_pb2, health_pb2_grpc

ENDPOINTS = "127.0.0.1:18001,127.0.0.2:18001,127.0.0.3:18001"
FULL_DUPLEX = 4


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def messages(tokens: int) -> list[ProcessingRequest]:
    headers = HeaderMap(headers=[HeaderValue(key=k, raw_value=v.encode()) for k, v in (
        (":method", "POST"), (":path", "/v1/completions"), (":authority", "bench"), ("content-type", "application/json"))])
    payload = orjson.dumps({"model": "m", "prompt": list(range(tokens)), "max_tokens": 4})
    first = ProcessingRequest(request_headers=HttpHeaders(headers=headers, end_of_stream=False))
    first.protocol_config.request_body_mode = FULL_DUPLEX
    return [first, ProcessingRequest(request_body=HttpBody(body=payload, end_of_stream=True))]


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start(port: int, tls: bool) -> subprocess.Popen[bytes]:
    argv = ["ppc-extproc", "serve", "--endpoints", ENDPOINTS, "--grpc-address", "127.0.0.1", "--grpc-port", str(port),
            "--admin-port", "-1", "--log-level", "error", *(["--secure-serving"] if tls else [])]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def credentials(port: int) -> grpc.ChannelCredentials:
    pem = ssl.get_server_certificate(("127.0.0.1", port), timeout=5)
    return grpc.ssl_channel_credentials(root_certificates=pem.encode())


def channel(port: int, creds: grpc.ChannelCredentials | None) -> grpc.aio.Channel:
    if creds is None:
        return grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    return grpc.aio.secure_channel(f"127.0.0.1:{port}", creds, options=[("grpc.ssl_target_name_override", "localhost")])


async def ready(port: int, tls: bool, timeout: float = 60.0) -> grpc.ChannelCredentials | None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            creds = await asyncio.to_thread(credentials, port) if tls else None
            async with channel(port, creds) as ch:
                reply = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""), timeout=2)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return creds
        except (grpc.aio.AioRpcError, OSError, ssl.SSLError):
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"the service on {port} did not become ready")
        await asyncio.sleep(0.1)


async def one(stub: Any, batch: list[ProcessingRequest]) -> None:
    call = stub.Process(timeout=10)
    for message in batch:
        await call.write(message)
    reply = await call.read()
    assert reply.request_headers.response.header_mutation.set_headers, reply
    await call.done_writing()
    while await call.read() is not grpc.aio.EOF:
        pass


async def round_of(batch: list[ProcessingRequest], pid: int, n: int, ch: grpc.aio.Channel) -> tuple[float, float]:
    stub = external_processor_pb2_grpc.ExternalProcessorStub(ch)
    cpu0, t0 = cpu_seconds(pid), time.perf_counter()
    for _ in range(n):
        await one(stub, batch)
    return (time.perf_counter() - t0) / n, (cpu_seconds(pid) - cpu0) / n


async def connects(batch: list[ProcessingRequest], port: int, creds: grpc.ChannelCredentials | None, n: int) -> float:
    total = 0.0
    for _ in range(n):
        t0 = time.perf_counter()
        async with channel(port, creds) as ch:
            await one(external_processor_pb2_grpc.ExternalProcessorStub(ch), batch)
        total += time.perf_counter() - t0
    return total / n


async def main_async(args: argparse.Namespace) -> None:
    ports = {"plaintext": free_port(), "tls": free_port()}
    procs = {name: start(port, name == "tls") for name, port in ports.items()}
    try:
        creds = {name: await ready(port, name == "tls") for name, port in ports.items()}
        channels = {name: channel(ports[name], creds[name]) for name in ports}
        results: dict[str, list[tuple[float, float]]] = {name: [] for name in ports}
        batch = messages(args.tokens)
        for name in ports:  # warm-up
            await round_of(batch, procs[name].pid, min(200, args.requests), channels[name])
        for _ in range(args.rounds):
            for name in ports:
                results[name].append(await round_of(batch, procs[name].pid, args.requests, channels[name]))
        connect = {name: await connects(batch, ports[name], creds[name], args.connects) for name in ports}
        for ch in channels.values():
            await ch.close()
    finally:
        for proc in procs.values():
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
    print(f"machine: {platform.machine()} {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}, "
          f"CPython {platform.python_version()}; command: {' '.join(sys.argv)}")
    print("| ext_proc port | latency per request, min (median) | server CPU per request, min (median) | new connection + 1 request |")
    print("|---|---:|---:|---:|")
    for name, rows in results.items():
        lat, cpu = sorted(r[0] for r in rows), sorted(r[1] for r in rows)
        print(f"| {name} | {lat[0] * 1e6:.0f} µs ({lat[len(lat) // 2] * 1e6:.0f}) | {cpu[0] * 1e6:.0f} µs "
              f"({cpu[len(cpu) // 2] * 1e6:.0f}) | {connect[name] * 1e3:.2f} ms |")
    lat = {n: sorted(r[0] for r in rows)[len(rows) // 2] for n, rows in results.items()}
    cpu = {n: sorted(r[1] for r in rows)[len(rows) // 2] for n, rows in results.items()}
    print(f"ratio tls / plaintext (medians): latency {lat['tls'] / lat['plaintext']:.2f}, "
          f"server CPU {cpu['tls'] / cpu['plaintext']:.2f}, connect {connect['tls'] / connect['plaintext']:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--connects", type=int, default=50)
    parser.add_argument("--tokens", type=int, default=64,
                        help="token ids in the prompt (100000: an agentic request's ~600 KB body)")
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
