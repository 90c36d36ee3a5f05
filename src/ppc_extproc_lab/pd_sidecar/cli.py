"""``python -m ppc_extproc_lab.pd_sidecar``: run the P/D routing sidecar in front of a decode engine.

On startup one JSON line goes to stdout: ``{"event": "pd_sidecar_ready", "url": "http://h:p",
"decoder_url": …, "kv_connector": …}``. SIGTERM/SIGINT stop it (exit 0). A flag that cannot be
used (a busy port, a bad value) is one line on stderr naming it, exit 2.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from collections.abc import Sequence

import structlog
from aiohttp import web

from ppc_extproc.cli.args import (
    OneLineParser,
    non_negative_float,
    non_negative_int,
    port_or_zero,
    positive_float,
    positive_int,
)
from ppc_extproc.errors import BindError
from ppc_extproc_lab.pd_sidecar.proxy import CONNECTORS, PREFILL_FALLBACKS, SidecarOptions, create_sidecar_app

__all__ = ["add_arguments", "main", "options_from_args"]

logger = structlog.get_logger()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the sidecar's flags on ``parser`` (upstream names where upstream has the flag)."""
    d = SidecarOptions(decoder_url="")
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default %(default)s)")
    parser.add_argument("--port", type=port_or_zero, default=8000, help="listen port; 0 = ephemeral (default %(default)s)")
    parser.add_argument("--decoder-url", required=True, help="the local decode engine, e.g. http://127.0.0.1:8200")
    parser.add_argument("--kv-connector", choices=CONNECTORS, default=d.kv_connector,
                        help="KV protocol between prefiller and decoder (default %(default)s)")
    parser.add_argument("--prefill-max-retries", type=non_negative_int, default=d.prefill_max_retries,
                        help="extra prefill attempts on 502/503/504 (default %(default)s)")
    parser.add_argument("--prefill-retry-backoff-ms", type=non_negative_float, default=d.prefill_retry_backoff_s * 1e3,
                        help="delay between prefill attempts (default %(default)s)")
    parser.add_argument("--prefill-fallback", choices=PREFILL_FALLBACKS, default=d.prefill_fallback,
                        help="on a prefill leg that cannot connect, times out or answers 5xx: 'none' relays "
                             "the failure (llm-d's sidecar), 'local' decodes the request on the local engine "
                             "(default %(default)s)")
    parser.add_argument("--enable-prefiller-sampling", action="store_true",
                        help="pick a random prefiller among the header's candidates instead of the first")
    parser.add_argument("--connect-timeout-s", type=positive_float, default=d.connect_timeout_s,
                        help="connect timeout of every upstream call (default %(default)s)")
    parser.add_argument("--read-timeout-s", type=positive_float, default=d.read_timeout_s,
                        help="longest wait for any read from an upstream (default %(default)s)")
    parser.add_argument("--prefill-timeout-s", type=positive_float, default=d.prefill_timeout_s,
                        help="longest prefill leg, retries included; then 504 (default %(default)s)")
    parser.add_argument("--max-in-flight", type=positive_int, default=d.max_in_flight,
                        help="requests handled at once; more get 503 (default %(default)s)")


def options_from_args(args: argparse.Namespace) -> SidecarOptions:
    """The :class:`SidecarOptions` of parsed flags."""
    return SidecarOptions(
        decoder_url=args.decoder_url,
        kv_connector=args.kv_connector,
        prefill_max_retries=args.prefill_max_retries,
        prefill_retry_backoff_s=args.prefill_retry_backoff_ms / 1e3,
        enable_prefiller_sampling=args.enable_prefiller_sampling,
        prefill_fallback=args.prefill_fallback,
        connect_timeout_s=args.connect_timeout_s,
        read_timeout_s=args.read_timeout_s,
        prefill_timeout_s=args.prefill_timeout_s,
        max_in_flight=args.max_in_flight,
    )


async def _run(args: argparse.Namespace) -> None:
    options = options_from_args(args)
    runner = web.AppRunner(create_sidecar_app(options), shutdown_timeout=0.5, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, args.host, args.port)
        try:
            await site.start()
        except OSError as exc:
            raise BindError.classify(exc, args.host, args.port, host_flag="--host", port_flag="--port") from None
        port = runner.addresses[0][1]
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        ready = {"event": "pd_sidecar_ready", "url": f"http://{args.host}:{port}",
                 "decoder_url": options.decoder_url, "kv_connector": options.kv_connector}
        print(json.dumps(ready), flush=True)
        await stop.wait()
    finally:
        await runner.cleanup()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point (``python -m ppc_extproc_lab.pd_sidecar``)."""
    parser = OneLineParser(prog="pd-sidecar", description="llm-d's P/D routing sidecar protocol, for the lab.")
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        asyncio.run(_run(args))
    except BindError as e:
        print(f"pd-sidecar: {e}", file=sys.stderr)
        return 2
    except ValueError as e:
        print(f"pd-sidecar: {e}", file=sys.stderr)
        return 2
    return 0
