"""``ppc-extproc demo``: precise-prefix routing vs round-robin on a local cluster, one command;
``--pd``: P/D disaggregation (prefill engines + decode pods behind llm-d's sidecar protocol) vs the
same engines aggregated."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from typing import TYPE_CHECKING

from ppc_extproc.cli.args import non_negative_float, positive_float, positive_int
from ppc_extproc_lab.demo.defaults import (
    DEFAULT_DRAIN_S,
    DEFAULT_DURATION_S,
    DEFAULT_ENGINES,
    DEFAULT_FORM,
    DEFAULT_NUM_BLOCKS,
    DEFAULT_POLICIES,
    DEFAULT_RATE_PER_S,
    FORMS,
    PD_POLICIES,
)
from ppc_extproc_lab.workload.policies import ALL_POLICIES
from ppc_extproc_lab.workload.spec import EngineProfile, WorkloadSpec, from_flags

if TYPE_CHECKING:
    from ppc_extproc_lab.demo.run import DemoOptions

__all__ = ["add_arguments", "main", "options_from_args"]


def _policies(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in ALL_POLICIES]
    if not names or unknown:
        raise argparse.ArgumentTypeError(
            f"unknown policy {', '.join(unknown) or '(none)'}; choose from {', '.join(ALL_POLICIES)}"
        )
    return names


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``demo`` flags."""
    w, e = WorkloadSpec(), EngineProfile()
    p.add_argument("--engines", type=positive_int, default=DEFAULT_ENGINES, help="mock engines (default %(default)s)")
    p.add_argument(
        "--rate",
        type=positive_float,
        default=DEFAULT_RATE_PER_S,
        help="Poisson arrivals per second (default %(default)s)",
    )
    p.add_argument(
        "--duration",
        type=positive_float,
        default=DEFAULT_DURATION_S,
        help="seconds of arrivals per policy (default %(default)s)",
    )
    p.add_argument("--seed", type=int, default=w.seed, help="workload seed (default %(default)s)")
    p.add_argument("--max-requests", type=positive_int, default=None, help="stop the schedule after this many requests")
    p.add_argument(
        "--policies", type=_policies, default=None,
        help=f"comma-separated, first is compared with second (default {','.join(DEFAULT_POLICIES)}; "
        f"choices: {', '.join(ALL_POLICIES)})",
    )  # fmt: skip
    p.add_argument(
        "--pd", action="store_true",
        help=f"compare P/D on (policy pd: prefill engines + decode pods with sidecars) with P/D off (the "
        f"same engines aggregated, policy default); sets --policies {','.join(PD_POLICIES)} unless given",
    )  # fmt: skip
    p.add_argument(
        "--prefill-engines", type=positive_int, default=None,
        help="of --engines, the prefill engines of a P/D policy (default: half)",
    )  # fmt: skip
    p.add_argument("--tenants", type=positive_int, default=w.tenants, help="tenants (default %(default)s)")
    p.add_argument("--users-per-tenant", type=positive_int, default=w.users_per_tenant, help="(default %(default)s)")
    p.add_argument(
        "--context-tokens",
        type=positive_int,
        default=w.context_tokens,
        help="shared context per tenant (default %(default)s)",
    )
    p.add_argument("--question-tokens", type=positive_int, default=w.question_tokens, help="(default %(default)s)")
    p.add_argument(
        "--output-tokens",
        type=positive_int,
        default=w.output_tokens,
        help="max_tokens per request (default %(default)s)",
    )
    p.add_argument(
        "--turns",
        type=positive_int,
        default=w.turns_per_session,
        help="turns per session (default %(default)s)",
    )
    p.add_argument(
        "--num-blocks",
        type=positive_int,
        default=DEFAULT_NUM_BLOCKS,
        help="KV blocks per engine (default %(default)s)",
    )
    p.add_argument(
        "--block-size",
        type=positive_int,
        default=e.block_size,
        help="tokens per block (default %(default)s)",
    )
    p.add_argument("--max-num-seqs", type=positive_int, default=e.max_num_seqs, help="(default %(default)s)")
    p.add_argument(
        "--prefill-tokens-per-s",
        type=positive_float,
        default=e.prefill_tokens_per_s,
        help="(default %(default)s)",
    )
    p.add_argument(
        "--decode-ms-per-token",
        type=non_negative_float,
        default=e.decode_ms_per_token,
        help="(default %(default)s)",
    )
    p.add_argument(
        "--drain",
        type=non_negative_float,
        default=DEFAULT_DRAIN_S,
        help="seconds after the last arrival before cut-off (default %(default)s)",
    )
    p.add_argument(
        "--form", choices=FORMS, default=DEFAULT_FORM,
        help="chat: /v1/chat/completions through the openai client, the engines and the service "
        "tokenizing with a tiny tokenizer built at run time; text: string prompts; tokens: token-id "
        "prompts (default %(default)s)",
    )  # fmt: skip
    p.add_argument(
        "--json",
        action="store_true",
        help="print the results as JSON on stdout (progress still on stderr)",
    )
    p.add_argument(
        "--keep-logs",
        action="store_true",
        help="keep the processes' logs (their directory is logged)",
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="also exit 1 unless every request succeeded and the first policy beats the second on hit "
        "rate (what CI runs; with a P/D first policy: some request was disaggregated); without it the exit status is 1 only when a policy completed less than "
        "90%% of its schedule",
    )
    p.add_argument("--log-level", choices=["debug", "info", "warning", "error"], default="warning")


def options_from_args(args: argparse.Namespace) -> DemoOptions:
    """``DemoOptions`` from the parsed flags (``ValueError`` for inconsistent values)."""
    from ppc_extproc_lab.demo.run import DemoOptions

    spec, profile = from_flags(args)
    policies = args.policies or (PD_POLICIES if args.pd else DEFAULT_POLICIES)
    if args.prefill_engines is not None and not args.prefill_engines < args.engines:
        raise ValueError(f"--prefill-engines: must be less than --engines ({args.engines})")
    return DemoOptions(
        engines=args.engines, rate_per_s=args.rate, duration_s=args.duration, seed=args.seed,
        policies=policies, workload=spec, profile=profile, drain_s=args.drain,
        max_requests=args.max_requests, keep_logs=args.keep_logs, form=args.form,
        prefill_engines=args.prefill_engines or 0,
    )  # fmt: skip


def main(args: argparse.Namespace) -> int:
    from ppc_extproc.observability.logging import configure_logging
    from ppc_extproc_lab.demo.run import describe, failures, render, run_demo
    from ppc_extproc_lab.localcluster import LocalClusterError

    configure_logging("console", args.log_level)
    try:
        options = options_from_args(args)
        options.profile.check_fits(options.workload)
    except ValueError as exc:
        print(f"ppc-extproc demo: {exc}", file=sys.stderr)
        return 2
    if options.form == "chat" and importlib.util.find_spec("openai") is None:
        print("ppc-extproc demo: --form chat sends through the openai package, which is not installed: "
              "pip install -e '.[demo]' (or --form text)", file=sys.stderr)  # fmt: skip
        return 1
    print(describe(options), file=sys.stderr)
    try:
        result = run_demo(options)
    except KeyboardInterrupt:
        print("\nppc-extproc demo: interrupted; every process it started was stopped", file=sys.stderr)
        return 130
    except LocalClusterError as exc:
        print(f"ppc-extproc demo: could not start the local cluster: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(result.to_json(), indent=2, default=str))
    else:
        print()
        print(render(result))
    problems = failures(result.runs, check=args.check)
    for problem in problems:
        print(f"ppc-extproc demo: {problem}", file=sys.stderr)
    return 1 if problems else 0
