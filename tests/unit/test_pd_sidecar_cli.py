"""``python -m ppc_extproc_lab.pd_sidecar``: a flag mistake is one line naming the flag, exit 2."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ppc_extproc.cli.args import OneLineParser
from ppc_extproc_lab.pd_sidecar.cli import add_arguments, options_from_args


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        ([], "--decoder-url"),
        (["--decoder-url", "http://127.0.0.1:8200", "--kv-connector", "nixl"], "--kv-connector"),
        (["--decoder-url", "http://127.0.0.1:8200", "--prefill-max-retries", "-1"], "--prefill-max-retries"),
        (["--decoder-url", "http://127.0.0.1:8200", "--port", "70000"], "--port"),
    ],
)
def test_flag_mistakes(argv: list[str], flag: str) -> None:
    out = subprocess.run([sys.executable, "-m", "ppc_extproc_lab.pd_sidecar", *argv],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and flag in out.stderr, out.stderr


def test_options_mirror_llmd_defaults() -> None:
    p = OneLineParser(prog="pd-sidecar")
    add_arguments(p)
    o = options_from_args(p.parse_args(["--decoder-url", "http://127.0.0.1:8200"]))
    assert (o.kv_connector, o.prefill_max_retries, o.prefill_retry_backoff_s) == ("nixlv2", 0, 0.2)
