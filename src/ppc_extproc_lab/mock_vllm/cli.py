"""``ppc-extproc mock-vllm`` / ``python -m ppc_extproc_lab.mock_vllm``: run mock vLLM engines.

On startup one JSON line is printed to stdout::

    {"event": "mock_vllm_ready", "engines": [{"index": 0, "endpoint": "127.0.0.1:8000",
     "url": "http://127.0.0.1:8000", "kv_events_endpoint": "tcp://127.0.0.1:5557",
     "replay_endpoint": null, "topic": "kv@127.0.0.1:8000@mock-model"}]}

SIGTERM/SIGINT stop every engine (requests aborted, sockets closed with linger 0); exit 0.
SIGHUP is ignored. A flag that cannot be used (a busy port, a bad value) is one line on stderr
naming it, exit 2.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
from collections.abc import Callable, Sequence

import structlog

from ppc_extproc.cli.args import (
    OneLineParser,
    non_negative_float,
    non_negative_int,
    port_or_zero,
    positive_float,
    positive_int,
)
from ppc_extproc.errors import BindError, ConfigError
from ppc_extproc_lab.mock_vllm.kv_events import ENCODINGS
from ppc_extproc_lab.mock_vllm.server import MockVllmFleet, MockVllmOptions, start_fleet

__all__ = ["add_arguments", "main", "options_from_args", "run"]

logger = structlog.get_logger()


def _topic(text: str) -> str:
    """``--topic``: only the documented placeholders."""
    try:
        text.format(host="h", port=1, endpoint="h:1", model="m", index=0)
    except (KeyError, IndexError, ValueError) as exc:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a topic: {exc}; placeholders are {{host}} {{port}} {{endpoint}} {{model}} {{index}}"
        ) from None
    return text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``mock-vllm`` flags on ``parser``."""
    d = MockVllmOptions()
    parser.add_argument("--host", default=d.host, help="HTTP bind address (default %(default)s)")
    parser.add_argument(
        "--port", type=port_or_zero, default=d.port, help="HTTP port; 0 = ephemeral (default %(default)s)"
    )
    parser.add_argument(
        "--advertise-host",
        default=None,
        help="host used in the topic and the x-mock-vllm-endpoint header (default: --host)",
    )
    parser.add_argument(
        "--advertise-port",
        type=port_or_zero,
        default=None,
        help="port used in the topic and the x-mock-vllm-endpoint header, e.g. a sidecar's in front "
        "of this engine (default: --port)",
    )
    parser.add_argument("--model", default=d.model, help="served model name (default %(default)s)")
    parser.add_argument(
        "--block-size",
        type=positive_int,
        default=d.block_size,
        help="tokens per KV block (default %(default)s)",
    )
    parser.add_argument(
        "--kv-groups",
        choices=("full", "hybrid"),
        default=d.kv_groups,
        help="KV-cache groups: one full-attention group, or hybrid (plus sliding-window and Mamba "
        "groups at the same block size) (default %(default)s)",
    )
    parser.add_argument(
        "--num-blocks",
        type=positive_int,
        default=d.num_blocks,
        help="KV blocks per engine (default %(default)s)",
    )
    parser.add_argument(
        "--kv-events-endpoint",
        default=None,
        help="ZMQ PUB endpoint, always bound (default tcp://<host>:5557; '' disables events)",
    )
    parser.add_argument(
        "--replay-endpoint", default=None, help="ZMQ ROUTER replay endpoint (default: off)"
    )
    parser.add_argument(
        "--replay-format",
        choices=("new", "old"),
        default=d.replay_format,
        help="replay replies with topic (vLLM >=0.26, 'new') or without ('old')",
    )
    parser.add_argument(
        "--topic",
        type=_topic,
        default=None,
        help="ZMQ topic (default kv@<advertise-host>:<port>@<model>); "
        "may use {host} {port} {endpoint} {model} {index}",
    )
    parser.add_argument(
        "--event-encoding",
        choices=ENCODINGS,
        default=d.event_encoding,
        help="array = vLLM 0.22-0.23, map = 0.26-0.28, map16 = 0.33 (default %(default)s)",
    )
    parser.add_argument(
        "--buffer-steps",
        type=non_negative_int,
        default=d.buffer_steps,
        help="replay buffer, in batches (default %(default)s)",
    )
    parser.add_argument(
        "--hwm", type=non_negative_int, default=d.hwm, help="PUB high-water mark (default %(default)s)"
    )
    parser.add_argument(
        "--max-num-seqs",
        type=positive_int,
        default=d.max_num_seqs,
        help="max running requests (default %(default)s)",
    )
    parser.add_argument(
        "--prefill-tokens-per-s",
        type=positive_float,
        default=d.prefill_tokens_per_s,
        help="prefill speed of the serial prefill lane (default %(default)s)",
    )
    parser.add_argument(
        "--decode-ms-per-token",
        type=non_negative_float,
        default=d.decode_ms_per_token,
        help="decode step length; all running requests decode together (default %(default)s)",
    )
    parser.add_argument(
        "--kv-transfer-ms-per-token",
        type=non_negative_float,
        default=d.kv_transfer_ms_per_token,
        help="P/D decode legs (kv_transfer_params.do_remote_prefill): transfer time per prompt token "
        "not cached locally, instead of prefill (default %(default)s)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=d.seed,
        help="seed of the deterministic output tokens (default %(default)s)",
    )
    parser.add_argument(
        "--count",
        type=positive_int,
        default=d.count,
        help="engines to serve, on consecutive ports (HTTP, KV events and replay +i) (default %(default)s)",
    )
    parser.add_argument(
        "--distinct-hosts",
        action="store_true",
        help="with --count: engine i binds the IPv4 address --host + i on the same ports (KV events and "
        "replay too) instead of port + i, like pods",
    )
    parser.add_argument(
        "--stream-interval-ms",
        type=non_negative_float,
        default=d.stream_interval_s * 1e3,
        help="minimum spacing of a stream's writes; tokens due together are written together; "
        "0 = one write per token (default %(default)s)",
    )
    parser.add_argument(
        "--metrics-update-ms",
        type=non_negative_float,
        default=d.metrics_update_interval_s * 1e3,
        help="/metrics gauges (running, waiting, KV usage) are a snapshot at most this old, as vLLM "
        "updates them once per engine step; 0 = live (default %(default)s)",
    )
    parser.add_argument(
        "--tokenizer",
        default=None,
        metavar="DIR",
        help="HF model directory (tokenizer.json, chat template): tokenize text, chat and messages with it "
        "and serve /tokenize and the render routes (default: UTF-8 bytes as ids)",
    )
    parser.add_argument(
        "--log-level",
        default="info",
        choices=("debug", "info", "warning", "error"),
        help="log level (default %(default)s)",
    )


def options_from_args(args: argparse.Namespace) -> MockVllmOptions:
    """Parsed flags → :class:`MockVllmOptions`."""
    return MockVllmOptions(
        host=args.host,
        port=args.port,
        advertise_host=args.advertise_host,
        advertise_port=args.advertise_port,
        model=args.model,
        block_size=args.block_size,
        kv_groups=args.kv_groups,
        num_blocks=args.num_blocks,
        max_num_seqs=args.max_num_seqs,
        prefill_tokens_per_s=args.prefill_tokens_per_s,
        decode_ms_per_token=args.decode_ms_per_token,
        seed=args.seed,
        metrics_update_interval_s=args.metrics_update_ms / 1e3,
        kv_events_endpoint=args.kv_events_endpoint,
        replay_endpoint=args.replay_endpoint or None,
        replay_format=args.replay_format,
        topic=args.topic,
        event_encoding=args.event_encoding,
        buffer_steps=args.buffer_steps,
        hwm=args.hwm,
        count=args.count,
        distinct_hosts=args.distinct_hosts,
        stream_interval_s=args.stream_interval_ms / 1e3,
        tokenizer=args.tokenizer,
        kv_transfer_ms_per_token=args.kv_transfer_ms_per_token,
    )


async def run(
    args: argparse.Namespace,
    *,
    stop: asyncio.Event | None = None,
    on_ready: Callable[[MockVllmFleet], None] | None = None,
) -> None:
    """Serve until SIGTERM/SIGINT (or until ``stop`` is set), then shut down cleanly."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    fleet = await start_fleet(options_from_args(args))
    installed: list[signal.Signals] = []
    try:
        handlers: dict[signal.Signals, Callable[[], None]] = {
            signal.SIGTERM: stop.set, signal.SIGINT: stop.set, signal.SIGHUP: lambda: logger.info("sighup_ignored"),
        }
        for sig, handler in handlers.items():
            try:
                loop.add_signal_handler(sig, handler)
                installed.append(sig)
            except (NotImplementedError, RuntimeError):  # not the main thread / platform
                pass
        ready = {"event": "mock_vllm_ready", "engines": [e.describe() for e in fleet.engines]}
        print(json.dumps(ready), flush=True)
        if on_ready is not None:
            on_ready(fleet)
        await stop.wait()
        logger.info("mock_vllm_stopping")
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)
        await fleet.stop()


def _configure_logging(level: str) -> None:
    if structlog.is_configured():
        return
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper())),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )


def main(args: argparse.Namespace | Sequence[str] | None = None) -> int:
    """Entry point: accepts parsed flags (project CLI) or an argv list (``python -m``)."""
    if not isinstance(args, argparse.Namespace):
        parser = OneLineParser(
            prog="ppc-extproc mock-vllm",
            description="Run mock vLLM engines: vLLM's HTTP surface and KV events (ZMQ).",
        )
        add_arguments(parser)
        args = parser.parse_args(args)
    _configure_logging(args.log_level)
    try:
        asyncio.run(run(args))
    except BindError as e:
        print(f"ppc-extproc mock-vllm: {e}", file=sys.stderr)
        return 2
    except ConfigError as e:
        print(f"ppc-extproc mock-vllm: --tokenizer: {e}", file=sys.stderr)
        return 2
    except (OSError, ValueError) as e:  # e.g. --tokenizer not a model directory, --distinct-hosts on IPv6
        print(f"ppc-extproc mock-vllm: cannot start: {e}", file=sys.stderr)
        return 2
    return 0
