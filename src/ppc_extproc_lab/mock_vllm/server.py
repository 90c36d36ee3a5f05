"""Start and stop one or more mock engines (HTTP server + KV-event publisher) in this process.

With ``count = N`` engine ``i`` serves HTTP on ``port + i`` and offsets its KV-event and replay
endpoints like vLLM's DP ranks (``tcp`` port + i; port 0 stays ephemeral; ``ipc``/``inproc``
get a ``_i`` suffix). With ``distinct_hosts`` engine ``i`` instead binds the IPv4 address
``host + i`` (``127.0.0.2``, ``127.0.0.3``, …) on the same ports, like pods: one process serves
many endpoints, each with its own address, cache, scheduler, seq counter, KV-event socket and
metrics; idle engines cost no CPU (the time model wakes only for work).
Port 0 binds an ephemeral port; :meth:`RunningEngine.describe` reports the real addresses.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from typing import Any

import structlog
from aiohttp import web

from ppc_extproc.errors import BindError
from ppc_extproc.tokenizer.local import LocalTokenizer
from ppc_extproc_lab.mock_vllm.engine import EngineConfig, MockEngine
from ppc_extproc_lab.mock_vllm.http import create_app
from ppc_extproc_lab.mock_vllm.kv_events import Encoding, vllm_version_for
from ppc_extproc_lab.mock_vllm.publisher import (
    EventPublisher,
    NullEventPublisher,
    ReplayFormat,
    ZmqEventPublisher,
    default_topic,
)

__all__ = [
    "MockVllmFleet",
    "MockVllmOptions",
    "RunningEngine",
    "offset_endpoint",
    "serve",
    "start_fleet",
]

logger = structlog.get_logger()


@dataclass(frozen=True, slots=True)
class MockVllmOptions:
    """Everything ``ppc-extproc mock-vllm`` can be told (defaults = CLI defaults)."""

    host: str = "127.0.0.1"
    port: int = 8000
    advertise_host: str | None = None
    #: Port used in the topic and ``x-mock-vllm-endpoint`` (engine ``i``: ``+ i``); None ⇒ the
    #: bound port. A P/D decode pod advertises its sidecar's port, as the pod's endpoint.
    advertise_port: int | None = None
    model: str = "mock-model"
    block_size: int = 16
    #: "full" or "hybrid" KV-cache groups (``EngineConfig.kv_groups``).
    kv_groups: str = "full"
    num_blocks: int = 2048
    max_num_seqs: int = 16
    prefill_tokens_per_s: float = 20_000.0
    decode_ms_per_token: float = 5.0
    seed: int = 0
    #: None ⇒ ``tcp://<host>:5557``; ``""`` ⇒ no KV events.
    kv_events_endpoint: str | None = None
    replay_endpoint: str | None = None
    replay_format: ReplayFormat = "new"
    #: None ⇒ ``kv@<advertise_host>:<port>@<model>``; may use ``{host} {port} {endpoint} {model} {index}``.
    topic: str | None = None
    event_encoding: Encoding = "map"
    buffer_steps: int = 10_000
    hwm: int = 100_000
    count: int = 1
    #: Engine ``i`` binds ``host + i`` (IPv4) on the same ports instead of ``port + i``.
    distinct_hosts: bool = False
    #: Minimum spacing of a stream's writes; 0 ⇒ one write per token.
    stream_interval_s: float = 0.02
    #: ``/metrics`` gauges are a snapshot at most this old (vLLM updates them per engine step).
    metrics_update_interval_s: float = 0.0
    #: HF model directory (``tokenizer.json`` + chat template): text, chat and messages are
    #: tokenized with it and the render/tokenize routes are served; None ⇒ UTF-8 bytes as ids.
    tokenizer: str | None = None
    #: P/D decode legs: transfer time per prompt token received from the remote prefill.
    kv_transfer_ms_per_token: float = 0.01


def offset_endpoint(endpoint: str | None, index: int) -> str | None:
    """Endpoint of engine ``index``: vLLM's DP-rank port offset (port 0 / ``*`` unchanged)."""
    if not endpoint or index == 0:
        return endpoint
    if endpoint.startswith("tcp://"):
        base, _, port = endpoint.rpartition(":")
        if port in ("0", "*"):
            return endpoint
        return f"{base}:{int(port) + index}"
    return f"{endpoint}_{index}"


def _with_host(endpoint: str, host: str) -> str:
    """``tcp://<any>:<port>`` → ``tcp://<host>:<port>`` (other transports unchanged)."""
    if not endpoint.startswith("tcp://"):
        return endpoint
    _, _, port = endpoint.rpartition(":")
    return f"tcp://{host}:{port}"


def _host_for_url(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def _listen(host: str, port: int) -> socket.socket:
    family, type_, proto, _, addr = socket.getaddrinfo(
        host.strip("[]"), port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, type_, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
    except OSError:
        sock.close()
        raise
    return sock


@dataclass(slots=True)
class RunningEngine:
    """One served engine and its addresses."""

    index: int
    engine: MockEngine
    publisher: EventPublisher
    runner: web.AppRunner
    #: Advertised ``ip:port`` (topic pod id and ``x-mock-vllm-endpoint``).
    endpoint: str
    #: ``http://host:port`` to reach it.
    url: str
    kv_events_endpoint: str | None
    replay_endpoint: str | None
    topic: str

    def describe(self) -> dict[str, Any]:
        """JSON-able summary (the CLI prints these on startup)."""
        return {
            "index": self.index,
            "endpoint": self.endpoint,
            "url": self.url,
            "kv_events_endpoint": self.kv_events_endpoint,
            "replay_endpoint": self.replay_endpoint,
            "topic": self.topic,
        }


@dataclass(slots=True)
class MockVllmFleet:
    """The engines started by :func:`start_fleet`."""

    engines: list[RunningEngine] = field(default_factory=list)

    async def stop(self) -> None:
        """Abort in-flight requests, stop HTTP and close ZMQ sockets (linger 0)."""
        for e in self.engines:
            e.engine.close()
        for e in self.engines:
            try:
                await e.runner.cleanup()
            finally:
                await e.publisher.close()
        self.engines.clear()


def _host_plus(host: str, index: int) -> str:
    """``host`` (an IPv4 address) advanced by ``index``."""
    return str(ipaddress.IPv4Address(host) + index)


async def _start_engine(options: MockVllmOptions, index: int, tokenizer: LocalTokenizer | None = None) -> RunningEngine:
    if options.distinct_hosts:
        host = _host_plus(options.host, index)
        options = replace(options, host=host, advertise_host=host if options.advertise_host is None
                          else _host_plus(options.advertise_host, index))
        if options.kv_events_endpoint:
            options = replace(options, kv_events_endpoint=_with_host(options.kv_events_endpoint, host))
        if options.replay_endpoint:
            options = replace(options, replay_endpoint=_with_host(options.replay_endpoint, host))
        port_index = 0
    else:
        port_index = index
    http_port = options.port + port_index if options.port else 0
    try:
        sock = _listen(options.host, http_port)
    except OSError as exc:
        raise BindError.classify(exc, options.host, http_port, host_flag="--host", port_flag="--port") from None
    publisher: EventPublisher | None = None
    try:
        port = sock.getsockname()[1]
        adv_host = (options.advertise_host or options.host).strip("[]")
        adv_port = port if options.advertise_port is None else options.advertise_port + port_index
        endpoint = f"{adv_host}:{adv_port}"
        if options.topic is None:
            topic = default_topic(endpoint, options.model)
        else:
            topic = options.topic.format(
                host=adv_host, port=adv_port, endpoint=endpoint, model=options.model, index=index
            )
        kv_ep = options.kv_events_endpoint
        if kv_ep is None:
            kv_ep = f"tcp://{_host_for_url(options.host.strip('[]'))}:5557"
        kv_ep = offset_endpoint(kv_ep, port_index)
        if kv_ep:
            replay_ep = offset_endpoint(options.replay_endpoint, port_index)
            try:
                zpub = ZmqEventPublisher(
                    kv_ep,
                    topic=topic,
                    encoding=options.event_encoding,
                    replay_endpoint=replay_ep,
                    buffer_steps=options.buffer_steps,
                    hwm=options.hwm,
                    replay_format=options.replay_format,
                )
            except OSError as exc:
                flag = "--replay-endpoint" if replay_ep and exc.filename == replay_ep else "--kv-events-endpoint"
                raise BindError(flag, str(exc.filename), exc.strerror or str(exc)) from None
            publisher = zpub
            kv_config: dict[str, Any] = {
                "enable_kv_cache_events": True,
                "publisher": "zmq",
                "endpoint": zpub.endpoint,
                "replay_endpoint": zpub.replay_endpoint,
                "buffer_steps": options.buffer_steps,
                "hwm": options.hwm,
                "max_queue_size": 100_000,
                "topic": topic,
            }
            bound_kv, bound_replay = zpub.endpoint, zpub.replay_endpoint
        else:
            publisher = NullEventPublisher(topic)
            kv_config = {"enable_kv_cache_events": False, "publisher": "null", "topic": topic}
            bound_kv, bound_replay = None, None
        engine = MockEngine(
            EngineConfig(
                model=options.model,
                block_size=options.block_size,
                kv_groups=options.kv_groups,
                num_blocks=options.num_blocks,
                max_num_seqs=options.max_num_seqs,
                prefill_tokens_per_s=options.prefill_tokens_per_s,
                decode_ms_per_token=options.decode_ms_per_token,
                seed=options.seed,
                kv_transfer_ms_per_token=options.kv_transfer_ms_per_token,
            ),
            publisher,
        )
        app = create_app(
            engine,
            advertised_endpoint=endpoint,
            vllm_version=vllm_version_for(options.event_encoding),
            event_encoding=options.event_encoding,
            kv_events_config=kv_config,
            engine_index=index,
            tokenizer=tokenizer,
            stream_interval_s=options.stream_interval_s,
            metrics_update_interval_s=options.metrics_update_interval_s,
        )
        runner = web.AppRunner(app, shutdown_timeout=0.5, access_log=None)
        await runner.setup()
        try:
            await web.SockSite(runner, sock).start()
            await publisher.start()
        except BaseException:
            await runner.cleanup()
            raise
    except BaseException:
        sock.close()
        if publisher is not None:
            await publisher.close()
        raise
    url = f"http://{_host_for_url(options.host.strip('[]'))}:{port}"
    logger.info(
        "mock_vllm_started",
        endpoint=endpoint,
        url=url,
        kv_events_endpoint=bound_kv,
        replay_endpoint=bound_replay,
        topic=topic,
        encoding=options.event_encoding,
    )
    return RunningEngine(
        index, engine, publisher, runner, endpoint, url, bound_kv, bound_replay, topic
    )


async def start_fleet(options: MockVllmOptions) -> MockVllmFleet:
    """Start ``options.count`` engines; on any failure stop those already started."""
    if options.count < 1:
        raise ValueError("count must be at least 1")
    fleet = MockVllmFleet()
    tokenizer = LocalTokenizer.from_dir(options.tokenizer) if options.tokenizer else None
    try:
        for i in range(options.count):
            fleet.engines.append(await _start_engine(options, i, tokenizer))
    except BaseException:
        await fleet.stop()
        raise
    return fleet


@contextlib.asynccontextmanager
async def serve(options: MockVllmOptions) -> AsyncIterator[MockVllmFleet]:
    """``async with serve(opts) as fleet:`` — engines are stopped on exit."""
    fleet = await start_fleet(options)
    try:
        yield fleet
    finally:
        await fleet.stop()
