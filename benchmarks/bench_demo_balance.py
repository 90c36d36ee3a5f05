"""The default policy's balance and TTFT against precise+load on the demo workload, over seeds.

Runs ``ppc-extproc demo --policies A,B --seed S --json`` once per seed and per order (the default
first, then precise+load first: the first policy runs on freshly started engines), and prints one
row per run and a summary: the default policy's max/mean requests per engine, how many runs are
at or under ``--aim``, and its TTFT p90 against precise+load's in the same run.

    python benchmarks/bench_demo_balance.py --seeds 0-5            # 12 demo runs, ~1.5 min each

A single demo run is deterministic in its schedule, not in its timings: the balance of one run
says little, the spread over seeds and orders is the figure.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from _common import header

_DEFAULT = "default"
_REFERENCE = "precise+load"


@dataclass(frozen=True, slots=True)
class PolicyFigures:
    max_mean: float
    ttft_p90_ms: float
    hit_rate: float
    errors: int


@dataclass(frozen=True, slots=True)
class DemoRun:
    seed: int
    order: str
    default: PolicyFigures
    reference: PolicyFigures


def seed_list(text: str) -> list[int]:
    """``0-5`` or ``0,2,7`` (an argparse type: a malformed value is a one-line usage error)."""
    try:
        if "-" in text:
            low, high = text.split("-", 1)
            seeds = list(range(int(low), int(high) + 1))
        else:
            seeds = [int(part) for part in text.split(",") if part]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 0-5 or 0,2,7, got {text!r}") from None
    if not seeds:
        raise argparse.ArgumentTypeError(f"no seeds in {text!r}")
    return seeds


def spread(values: list[float]) -> str:
    """Median and range of ``values``."""
    return f"median {statistics.median(values):.2f}, range {min(values):.2f}-{max(values):.2f}"


def _figures(result: dict[str, object]) -> PolicyFigures:
    summary = result["summary"]
    assert isinstance(summary, dict)
    return PolicyFigures(
        max_mean=float(summary["imbalance_max_mean"]),
        ttft_p90_ms=float(summary["ttft_p90_s"]) * 1000,
        hit_rate=float(summary["hit_rate"]),
        errors=int(summary["errors"]) + int(summary["unfinished"]),
    )


def run_demo(seed: int, policies: list[str], extra: list[str]) -> DemoRun:
    exe = Path(sys.executable).with_name("ppc-extproc")
    command = [str(exe), "demo", "--json", "--policies", ",".join(policies), "--seed", str(seed), *extra]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, check=False)
    if done.returncode != 0:
        raise SystemExit(f"demo seed {seed} failed (rc {done.returncode}): {done.stderr.strip()[-2000:]}")
    results = json.loads(done.stdout)["results"]
    by_policy = dict(zip(policies, results, strict=True))
    return DemoRun(
        seed=seed,
        order="default first" if policies[0] == _DEFAULT else "precise+load first",
        default=_figures(by_policy[_DEFAULT]),
        reference=_figures(by_policy[_REFERENCE]),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=seed_list, default="0-5", help="seeds, as 0-5 or 0,2,7 (default 0-5)")
    parser.add_argument("--orders", choices=["both", "default-first", "reference-first"], default="both")
    parser.add_argument("--aim", type=float, default=1.15, help="max/mean aim for the default policy (default 1.15)")
    parser.add_argument("--json-out", help="also write every run's figures here")
    args, extra = parser.parse_known_args()
    orders = {
        "both": [[_DEFAULT, _REFERENCE], [_REFERENCE, _DEFAULT]],
        "default-first": [[_DEFAULT, _REFERENCE]],
        "reference-first": [[_REFERENCE, _DEFAULT]],
    }[args.orders]
    header("the default policy against precise+load on the demo workload, over seeds")
    print(time.strftime("started %Y-%m-%d %H:%M UTC", time.gmtime()))
    print(
        f"{'seed':>4}  {'order':<19}  {'default max/mean':>16}  {'p+l max/mean':>12}  "
        f"{'default p90 ms':>14}  {'p+l p90 ms':>10}  {'hit default / p+l':>17}  errors"
    )
    runs: list[DemoRun] = []
    for seed in args.seeds:
        for policies in orders:
            run = run_demo(seed, policies, extra)
            runs.append(run)
            d, r = run.default, run.reference
            print(
                f"{run.seed:>4}  {run.order:<19}  {d.max_mean:>16.2f}  {r.max_mean:>12.2f}  {d.ttft_p90_ms:>14.0f}  "
                f"{r.ttft_p90_ms:>10.0f}  {d.hit_rate:>8.1%} / {r.hit_rate:>6.1%}  {d.errors + r.errors}",
                flush=True,
            )
    balance = [run.default.max_mean for run in runs]
    p90_ratio = [run.default.ttft_p90_ms / run.reference.ttft_p90_ms for run in runs]
    print(
        f"default max/mean: {spread(balance)}, {sum(b <= args.aim for b in balance)} of {len(runs)} runs <= {args.aim}"
    )
    print(f"precise+load max/mean: {spread([run.reference.max_mean for run in runs])}")
    print(
        f"default TTFT p90 / precise+load's: {spread(p90_ratio)}, {sum(r <= 1.0 for r in p90_ratio)} of {len(runs)} runs <= 1"
    )
    if args.json_out:  # "reference" is precise+load
        Path(args.json_out).write_text(json.dumps([asdict(run) for run in runs], indent=1))


if __name__ == "__main__":
    main()
