"""A mistake on the command line is one line on stderr naming the flag, exit 2, no traceback.

The parser in-process for every flag, and the installed ``ppc-extproc`` as a subprocess for a few;
every case fails before the command opens a socket.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from ppc_extproc.cli import build_parser


def run_cli(*argv: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            [sys.executable, "-m", "ppc_extproc", *argv], capture_output=True, text=True, timeout=timeout,
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
    except subprocess.TimeoutExpired as exc:  # it went on to run instead of refusing the flag
        pytest.fail(f"{argv} did not exit: {exc.stderr!r}")


def assert_one_line_naming(proc: subprocess.CompletedProcess[str], flag: str, *also: str) -> str:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert flag in lines[0]
    for text in also:
        assert text in lines[0]
    return lines[0]


@pytest.mark.parametrize(
    ("argv", "flag", "value"),
    [
        (["serve", "--grpc-port", "70000"], "--grpc-port", "70000"),
        (["serve", "--grpc-port", "-1"], "--grpc-port", "-1"),
        (["serve", "--grpc-port", "http"], "--grpc-port", "http"),
        (["serve", "--admin-port", "65536"], "--admin-port", "65536"),
        (["serve", "--admin-port", "-2"], "--admin-port", "-2"),
        (["serve", "--max-body-bytes", "-1"], "--max-body-bytes", "-1"),
        (["serve", "--drain-seconds", "-3"], "--drain-seconds", "-3"),
        (["serve", "--drain-seconds", "nan"], "--drain-seconds", "nan"),
        (["serve", "--workers", "-2"], "--workers", "-2"),
        (["serve", "--usage-sample-rate", "2"], "--usage-sample-rate", "2"),
        (["mock-vllm", "--port", "70000"], "--port", "70000"),
        (["mock-vllm", "--port", "-1"], "--port", "-1"),
        (["mock-vllm", "--count", "0"], "--count", "0"),
        (["mock-vllm", "--num-blocks", "-1"], "--num-blocks", "-1"),
        (["mock-vllm", "--block-size", "0"], "--block-size", "0"),
        (["mock-vllm", "--max-num-seqs", "-4"], "--max-num-seqs", "-4"),
        (["mock-vllm", "--buffer-steps", "-1"], "--buffer-steps", "-1"),
        (["mock-vllm", "--hwm", "-1"], "--hwm", "-1"),
        (["mock-vllm", "--prefill-tokens-per-s", "0"], "--prefill-tokens-per-s", "0"),
        (["mock-vllm", "--decode-ms-per-token", "-1"], "--decode-ms-per-token", "-1"),
        (["mock-vllm", "--stream-interval-ms", "-5"], "--stream-interval-ms", "-5"),
        (["mock-vllm", "--topic", "kv@{pod}"], "--topic", "{pod}"),
        (["demo", "--engines", "0"], "--engines", "0"),
        (["demo", "--rate", "-1"], "--rate", "-1"),
        (["demo", "--duration", "0"], "--duration", "0"),
        (["demo", "--drain", "-1"], "--drain", "-1"),
        (["demo", "--max-requests", "-5"], "--max-requests", "-5"),
        (["demo", "--num-blocks", "-1"], "--num-blocks", "-1"),
        (["demo", "--context-tokens", "-1"], "--context-tokens", "-1"),
        (["demo", "--decode-ms-per-token", "-1"], "--decode-ms-per-token", "-1"),
    ],
)
def test_bad_values_are_one_line_naming_the_flag(
    argv: list[str], flag: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(argv)
    err = capsys.readouterr().err
    proc = subprocess.CompletedProcess(argv, int(exited.value.code or 0), "", err)
    assert_one_line_naming(proc, f"argument {flag}", value)


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["serve", "--grpc-port", "70000"], "--grpc-port"),
        (["mock-vllm", "--count", "0"], "--count"),
        (["demo", "--duration", "-1"], "--duration"),
    ],
)
def test_the_installed_command_refuses_them(argv: list[str], flag: str) -> None:
    assert_one_line_naming(run_cli(*argv), f"argument {flag}", argv[-1])


def test_mock_vllm_as_a_module_refuses_the_same_way() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "ppc_extproc_lab.mock_vllm", "--port", "99999"], capture_output=True, text=True,
        timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert_one_line_naming(proc, "argument --port", "99999")


def test_an_unknown_flag_is_one_line() -> None:
    assert_one_line_naming(run_cli("serve", "--grpc-prot", "9002"), "--grpc-prot")


def test_no_command_prints_usage_and_exits_2() -> None:
    proc = run_cli()
    assert proc.returncode == 2
    assert proc.stderr.startswith("usage: ppc-extproc")
    assert "a command is required" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_an_unreadable_tls_file_is_named(tmp_path: Path) -> None:
    """Both files are read before anything binds; the message names the flag and the path."""
    cert = tmp_path / "tls.crt"
    cert.write_text("not checked before the key is read\n")
    key = tmp_path / "keys"  # a directory: exists, cannot be read as a file
    key.mkdir()
    proc = run_cli("serve", "--endpoints", "127.0.0.1:1", "--tls-cert-file", str(cert), "--tls-key-file", str(key),
                   "--log-level", "error")  # fmt: skip
    assert_one_line_naming(proc, "--tls-key-file", str(key))
    missing = tmp_path / "missing.crt"
    proc = run_cli("serve", "--endpoints", "127.0.0.1:1", "--tls-cert-file", str(missing), "--tls-key-file", str(cert),
                   "--log-level", "error")  # fmt: skip
    assert_one_line_naming(proc, "--tls-cert-file", str(missing))


@pytest.mark.parametrize(
    ("argv", "attr", "value"),
    [
        (["serve", "--grpc-port", "0"], "grpc_port", 0),
        (["serve", "--grpc-port", "65535"], "grpc_port", 65535),
        (["serve", "--admin-port", "-1"], "admin_port", -1),
        (["serve", "--admin-port", "0"], "admin_port", 0),
        (["serve", "--workers", "0"], "workers", 0),
        (["serve", "--drain-seconds", "0"], "drain_seconds", 0.0),
        (["mock-vllm", "--port", "0"], "port", 0),
        (["mock-vllm", "--decode-ms-per-token", "0"], "decode_ms_per_token", 0.0),
        (["mock-vllm", "--topic", "kv@{endpoint}@{model}"], "topic", "kv@{endpoint}@{model}"),
        (["demo", "--drain", "0"], "drain", 0.0),
    ],
)
def test_documented_special_values_are_accepted(argv: list[str], attr: str, value: object) -> None:
    assert getattr(build_parser().parse_args(argv), attr) == value


def test_argument_types() -> None:
    from ppc_extproc.cli import args as argtypes

    assert argtypes.port("1") == 1 and argtypes.port("65535") == 65535
    assert argtypes.port_or_zero("0") == 0
    for bad in ("0", "65536", "-1", "1.5", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            argtypes.port(bad)
    assert argtypes.non_negative_float("0") == 0.0 and argtypes.positive_float("0.5") == 0.5
    for bad in ("-0.1", "inf", "nan", "x"):
        with pytest.raises(argparse.ArgumentTypeError):
            argtypes.non_negative_float(bad)
    with pytest.raises(argparse.ArgumentTypeError):
        argtypes.positive_float("0")
    assert argtypes.non_negative_int("0") == 0 and argtypes.positive_int("3") == 3
    with pytest.raises(argparse.ArgumentTypeError):
        argtypes.positive_int("0")
    with pytest.raises(argparse.ArgumentTypeError):
        argtypes.non_negative_int("-1")
