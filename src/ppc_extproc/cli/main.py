"""``ppc-extproc`` command line: serve, demo, mock-vllm, keys."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Coroutine, Sequence
from typing import TYPE_CHECKING, Any

import orjson

from ppc_extproc import __version__
from ppc_extproc.blockkeys import TokenProcessor, TokenProcessorConfig
from ppc_extproc.blockkeys.config import HASH_ALGORITHMS
from ppc_extproc.cli.args import (
    OneLineParser,
    fraction,
    non_negative_float,
    non_negative_int,
    port_or_zero,
    positive_int,
)
from ppc_extproc.cli.llmd import LlmdFlagError, add_llmd_flags, chart_argv, fail, log_llmd_settings
from ppc_extproc.cli.llmd import resolve as resolve_llmd_flags

if TYPE_CHECKING:
    from ppc_extproc.framework import Discovery
    from ppc_extproc.observability.tracing import RequestTracer

__all__ = ["main"]


def _parse_tokens(text: str) -> list[int]:
    """``1,2,3`` or an inclusive range ``A..B`` (ranges and lists may be mixed: ``1..16,99``)."""
    tokens: list[int] = []
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        if ".." in part:
            start, _, end = part.partition("..")
            tokens.extend(range(int(start), int(end) + 1))
        else:
            tokens.append(int(part))
    for t in tokens:
        if not 0 <= t < 2**32:
            raise argparse.ArgumentTypeError(f"token id {t} is outside [0, 2^32)")
    return tokens


def _tokens_arg(text: str) -> list[int]:
    try:
        return _parse_tokens(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated ints or A..B, got {text!r}") from None


def _extras_arg(text: str) -> list[list[str] | None]:
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"--extra-per-block is not JSON: {exc}") from None
    ok = isinstance(value, list) and all(
        v is None or (isinstance(v, list) and all(isinstance(s, str) for s in v)) for v in value
    )
    if not ok:
        raise argparse.ArgumentTypeError("--extra-per-block must be a JSON list of (list of strings or null)")
    return value  # type: ignore[no-any-return]


def _keys(args: argparse.Namespace) -> int:
    try:
        processor = TokenProcessor(
            TokenProcessorConfig(args.block_size, args.hash_seed, args.hash_algorithm)
        )
    except ValueError as exc:
        print(f"ppc-extproc keys: {exc}", file=sys.stderr)
        return 2
    for key in processor.keys(args.tokens, args.model, parent=args.parent, extras=args.extra_per_block):
        print(key)
    return 0


def _add_keys(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "keys",
        help="print the request keys of a token list (one decimal key per line)",
        description="Print llm-d request keys of a token list, to see why a request and a KV event "
        "do not correlate. Only full blocks are keyed.",
    )
    p.add_argument("--model", required=True, help="model name (or LoRA adapter name) the keys are rooted in")
    p.add_argument("--tokens", required=True, type=_tokens_arg, help="token ids: 1,2,3 or a range A..B")
    p.add_argument("--block-size", type=int, default=16, help="blockSizeTokens (default 16)")
    p.add_argument("--hash-seed", default="", help="hashSeed (default empty)")
    p.add_argument(
        "--hash-algorithm",
        default="xxh64",
        choices=[a for a in HASH_ALGORITHMS if a],
        help="hashAlgorithm (default xxh64)",
    )
    p.add_argument("--parent", type=int, default=0, help="parent request key (default 0 = the model's root)")
    p.add_argument(
        "--extra-per-block",
        type=_extras_arg,
        default=None,
        help='JSON list, one entry per block: a list of identifier strings or null, e.g. \'[["salt"], null]\'',
    )
    p.set_defaults(handler=_keys)


def _add_mock_vllm(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from ppc_extproc_lab.mock_vllm import cli as mock_cli

    p = sub.add_parser(
        "mock-vllm",
        help="run mock vLLM engines (vLLM's HTTP API and KV events, with a simple time model)",
        description="A stand-in for vLLM pods: OpenAI completions on token prompts, a bounded "
        "prefix cache, KV events over ZMQ byte for byte as vLLM publishes them.",
    )
    mock_cli.add_arguments(p)
    p.set_defaults(handler=mock_cli.main)


def _add_demo(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from ppc_extproc_lab.demo import cli as demo_cli

    p = sub.add_parser(
        "demo",
        help="compare precise-prefix routing with round-robin on a local cluster (Envoy + mock engines)",
        description="Start Envoy, mock vLLM engines and the service on loopback, drive a shared-prefix "
        "multi-turn workload through Envoy under each policy, print a comparison table, stop everything.",
    )
    demo_cli.add_arguments(p)
    p.set_defaults(handler=demo_cli.main)


def _kubernetes_discovery(args: argparse.Namespace) -> Discovery | None:
    """The Kubernetes discovery source the --pool-*/--endpoint-* flags ask for, or None."""
    from ppc_extproc.discovery.kubernetes import KubernetesDiscovery, KubernetesFlags, config_from_flags

    flags = KubernetesFlags(
        pool_name=args.pool_name, pool_namespace=args.pool_namespace, pool_group=args.pool_group,
        endpoint_selector=args.endpoint_selector, endpoint_target_ports=args.endpoint_target_ports,
        kubeconfig=args.kubeconfig,
    )
    config = config_from_flags(flags, endpoints_given=args.endpoints is not None, config_file=args.config_file)
    return KubernetesDiscovery(config) if config is not None else None


def _tracer() -> RequestTracer | None:
    from ppc_extproc.observability.tracing import start_tracing

    return start_tracing()


def _add_kubernetes_flags(p: argparse.ArgumentParser) -> None:
    k8s = p.add_argument_group("Kubernetes discovery (llm-d's EPP flags; excludes --endpoints)")
    k8s.add_argument("--pool-name", help="watch this InferencePool and the ready pods its selector matches")
    k8s.add_argument("--pool-namespace", help="namespace of the pool and its pods (default: $NAMESPACE, "
                     "else the service account's namespace, else default)")
    k8s.add_argument("--pool-group", help="InferencePool API group (default inference.networking.k8s.io; "
                     "inference.networking.x-k8s.io reads the removed v1alpha2)")
    k8s.add_argument("--endpoint-selector", help="instead of a pool: a label selector for model-server pods, "
                     "e.g. 'app=vllm,env in (prod,staging)'")
    k8s.add_argument("--endpoint-target-ports", help="with --endpoint-selector: the ranks' ports in order, e.g. 8000,8001")
    k8s.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, in-cluster, ~/.kube/config)")
    k8s.add_argument("--crd-file", help="without Kubernetes: InferenceModelRewrite and InferenceObjective objects "
                     "from this YAML file (read at start)")


def _run_loop(main: Coroutine[Any, Any, None], event_loop: str) -> None:
    """Run ``main`` on uvloop (``auto`` when it is installed: ~10 % less CPU per request in
    grpc.aio's message path, BENCHMARKS.md "What routing costs") or asyncio's own loop."""
    import asyncio

    if event_loop != "asyncio":
        try:
            import uvloop
        except ImportError:
            if event_loop == "uvloop":
                raise
        else:
            uvloop.run(main)
            return
    asyncio.run(main)


def _serve(args: argparse.Namespace) -> int:
    from ppc_extproc.errors import BindError, ConfigError
    from ppc_extproc.observability.logging import configure_logging
    from ppc_extproc.scheduling.pool import parse_endpoint_list
    from ppc_extproc.server.app import ServeOptions, serve
    from ppc_extproc.server.stream import BodyMode
    from ppc_extproc.server.workers import cpu_count, supervise

    workers = args.workers if args.workers > 0 else cpu_count()
    if workers > 1 and args.worker_index is None:
        if args.grpc_port == 0:
            print("ppc-extproc serve: --workers needs a fixed --grpc-port (the workers share it)", file=sys.stderr)
            return 2
        return supervise(args.argv, workers, args.admin_port, stop_timeout=args.drain_seconds + 20.0)
    try:
        llmd = resolve_llmd_flags(args)
    except LlmdFlagError as exc:
        return fail(str(exc))
    configure_logging(llmd.log_format or args.log_format, llmd.log_level or args.log_level)
    log_llmd_settings(llmd)
    try:
        endpoints = parse_endpoint_list(args.endpoints) if args.endpoints is not None else None
    except ValueError as exc:
        print(f"ppc-extproc serve: --endpoints: {exc}", file=sys.stderr)
        return 2
    try:
        discovery = _kubernetes_discovery(args)
    except ConfigError as exc:
        print(f"ppc-extproc serve: {exc}", file=sys.stderr)
        return 2
    from ppc_extproc.discovery.kubernetes.extras import kubernetes_extras

    try:
        extras = kubernetes_extras(discovery, leader_election=llmd.leader_election, metrics_auth=llmd.metrics_auth)
    except ConfigError as exc:
        return fail(str(exc))
    crds = extras.crd_watch
    rewrites, objectives = (crds.rewrites, crds.objectives) if crds is not None else (None, None)
    if args.crd_file is not None:
        from ppc_extproc.scheduling.objectives import load_objects

        if crds is not None:
            return fail("--crd-file: in pool mode the cluster's InferenceModelRewrites and InferenceObjectives apply")
        try:
            rewrites, objectives = load_objects(args.crd_file)
        except ConfigError as exc:
            return fail(str(exc))
    admin_port = llmd.admin_port if llmd.admin_port is not None else args.admin_port
    options = ServeOptions(
        config_file=args.config_file,
        grpc_address=args.grpc_address,
        grpc_port=args.grpc_port,
        admin_address=llmd.admin_address or args.admin_address,
        admin_port=None if admin_port < 0 else admin_port,
        endpoints=endpoints,
        tls_cert_file=args.tls_cert_file or llmd.tls_cert_file,
        tls_key_file=args.tls_key_file or llmd.tls_key_file,
        max_body_bytes=args.max_body_bytes,
        default_body_mode=BodyMode[args.body_mode.upper().replace("-", "_")],
        json_errors=args.error_format == "openai",
        usage_sample_rate=args.usage_sample_rate,
        drain_seconds=args.drain_seconds,
        discovery=discovery,
        reuse_port=args.worker_index is not None,
        worker_index=args.worker_index,
        pool_name=args.pool_name or "",
        pool_namespace=args.pool_namespace or os.environ.get("NAMESPACE", ""),
        leader_elector=extras.leader_elector,
        rewrites=rewrites,
        objectives=objectives,
        background=(crds,) if crds is not None else (),
        metrics_auth=extras.metrics_auth,
        tracer=_tracer() if llmd.tracing else None,
        **llmd.serve_options(),
    )
    try:
        _run_loop(serve(options), args.event_loop)
    except BindError as exc:
        print(f"ppc-extproc serve: {exc}", file=sys.stderr)
        return 2
    except ConfigError as exc:
        print(f"ppc-extproc serve: configuration error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"ppc-extproc serve: {exc}", file=sys.stderr)
        return 1
    return 0


def _admin_port(text: str) -> int:
    """``--admin-port``: a port, 0 for any free one, or -1 for no admin server."""
    return -1 if text.strip() == "-1" else port_or_zero(text)


def _add_serve(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "serve",
        help="run the ext_proc endpoint picker",
        description="Run the Envoy ext_proc endpoint picker (gRPC) and its admin HTTP server. "
        "Arguments that start with a --flag (llm-d's chart form) mean 'serve --llm-d-defaults'.",
        allow_abbrev=False,  # pflag has no abbreviations: --grpc-health is unknown, not --grpc-health-port
    )
    p.add_argument("--config-file", help="EndpointPickerConfig YAML (default: the embedded default)")
    p.add_argument("--grpc-address", default="0.0.0.0", help="ext_proc listen address (default 0.0.0.0)")
    p.add_argument("--grpc-port", type=port_or_zero, default=9002, help="ext_proc port (default 9002; 0 = any free port)")
    p.add_argument("--admin-address", default="127.0.0.1", help="admin HTTP address (default 127.0.0.1)")
    p.add_argument("--admin-port", type=_admin_port, default=9090, help="admin HTTP port (default 9090; -1 disables)")
    p.add_argument("--endpoints", help="static endpoints ip:port,ip:port (instead of configured discovery)")
    p.add_argument("--tls-cert-file", help="serve ext_proc over TLS with this certificate (PEM)")
    p.add_argument("--tls-key-file", help="private key (PEM) for --tls-cert-file")
    p.add_argument("--max-body-bytes", type=positive_int, default=16 * 1024 * 1024, help="request bodies above get 413 (default 16 MiB)")
    p.add_argument(
        "--body-mode",
        choices=["full-duplex-streamed", "buffered"],
        default="full-duplex-streamed",
        help="request body mode assumed when Envoy does not announce it (default full-duplex-streamed)",
    )
    p.add_argument("--error-format", choices=["text", "openai"], default="text", help="error body format (default llm-d's text)")
    p.add_argument(
        "--usage-sample-rate", type=fraction, default=0.01, metavar="R",
        help="with Envoy sending no response bodies (envoy/envoy.yaml): ask for the body of this share of "
        "responses (mode_override) to read their usage for the usage and cached-tokens metrics; "
        "0 disables, 1 reads every response (default 0.01)",
    )
    p.add_argument("--drain-seconds", type=non_negative_float, default=10.0, help="how long open streams may finish at shutdown")
    p.add_argument(
        "--workers", type=non_negative_int, default=1, metavar="N",
        help="service processes sharing the gRPC port (SO_REUSEPORT), each a full service with its own "
        "index and KV-event subscribers; worker i serves admin on --admin-port + i; 0 = one per core (default 1)",
    )
    p.add_argument("--worker-index", type=non_negative_int, default=None, help=argparse.SUPPRESS)
    p.add_argument(
        "--event-loop", choices=["auto", "asyncio", "uvloop"], default="auto",
        help="asyncio event loop implementation; auto = uvloop when installed (default auto)",
    )
    p.add_argument("--log-format", choices=["json", "console"], default="json")
    p.add_argument("--log-level", choices=["debug", "info", "warning", "error"], default="info")
    _add_kubernetes_flags(p)
    add_llmd_flags(p)
    p.set_defaults(handler=_serve)


def _plugins(args: argparse.Namespace) -> int:
    from ppc_extproc.plugins.registry import plugin_doc, registered_types

    types = registered_types()
    if args.type is None:
        for type_name in types:
            summary = plugin_doc(type_name).splitlines()[0].removeprefix(f"``{type_name}``: ")
            print(f"{type_name:32} {summary}")
        print("\nppc-extproc plugins TYPE shows a type's formula, parameters and a YAML example.")
        return 0
    if args.type not in types:
        print(f"ppc-extproc plugins: unknown type {args.type!r}; supported: {', '.join(types)}", file=sys.stderr)
        return 2
    print(plugin_doc(args.type))
    return 0


def _add_plugins(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("plugins", help="list the supported plugin types, or document one")
    p.add_argument("type", nargs="?", help="a plugin type, e.g. prefix-cache-scorer")
    p.set_defaults(handler=_plugins)


def _check_config(args: argparse.Namespace) -> int:
    from ppc_extproc.config.describe import describe_config
    from ppc_extproc.config.epp import load_config
    from ppc_extproc.errors import ConfigError
    from ppc_extproc.observability.logging import configure_logging

    configure_logging("console", "error")  # warnings are part of the report, not log lines
    failed = 0
    for path in args.files:
        try:
            loaded = load_config(path)
        except ConfigError as exc:
            failed += 1
            print(f"{path}: invalid\n  error: {exc}")
            continue
        print(f"{path}: valid")
        for line in describe_config(loaded):
            print(f"  {line}")
    if len(args.files) > 1:
        print(f"\n{len(args.files) - failed} of {len(args.files)} configurations are valid")
    return 2 if failed else 0


def _add_check_config(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "check-config",
        help="validate EndpointPickerConfig files and print the resolved pipeline",
        description="Load each configuration as 'serve' would, without starting anything: print the "
        "profiles (filters, scorers with weights, picker), the producers in run order, data sources "
        "and their extractors, the defaults that were injected and any warnings; or the error with "
        "its field path. Exit 0 when every file is valid, 2 otherwise.",
    )
    p.add_argument("files", nargs="+", metavar="FILE", help="EndpointPickerConfig YAML files")
    p.set_defaults(handler=_check_config)


def build_parser() -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = OneLineParser(
        prog="ppc-extproc",
        description="Envoy ext_proc endpoint picker that routes LLM requests to the pod holding "
        "the longest cached KV prefix.",
    )
    parser.add_argument("--version", action="version", version=f"ppc-extproc {__version__}")
    # Subparsers take the parser's class, so their usage errors are one line too.
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_serve(sub)
    _add_mock_vllm(sub)
    _add_demo(sub)
    _add_keys(sub)
    _add_plugins(sub)
    _add_check_config(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = chart_argv(list(sys.argv[1:] if argv is None else argv))
    args = parser.parse_args(argv)
    args.argv = argv  # serve --workers re-runs it per worker
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_usage(sys.stderr)
        print("ppc-extproc: error: a command is required (see --help)", file=sys.stderr)
        return 2
    return int(handler(args))


if __name__ == "__main__":
    sys.exit(main())
