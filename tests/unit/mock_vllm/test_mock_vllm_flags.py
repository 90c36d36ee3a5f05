"""CLI flags → options, and the multi-engine endpoint offsets (no sockets)."""

from __future__ import annotations

import argparse

import pytest

from ppc_extproc_lab.mock_vllm.cli import add_arguments, options_from_args
from ppc_extproc_lab.mock_vllm.server import MockVllmOptions, offset_endpoint


def parse(*argv: str) -> MockVllmOptions:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return options_from_args(parser.parse_args(argv))


def test_defaults_match_the_documented_ones() -> None:
    opts = parse()
    assert opts == MockVllmOptions()
    assert (opts.host, opts.port, opts.model) == ("127.0.0.1", 8000, "mock-model")
    assert (opts.block_size, opts.num_blocks, opts.max_num_seqs) == (16, 2048, 16)
    assert (opts.prefill_tokens_per_s, opts.decode_ms_per_token) == (20_000.0, 5.0)
    assert opts.kv_events_endpoint is None and opts.replay_endpoint is None
    assert (opts.event_encoding, opts.replay_format, opts.buffer_steps) == ("map", "new", 10_000)


def test_flags_are_carried_over() -> None:
    opts = parse(
        "--host", "10.0.0.5", "--port", "9000", "--advertise-host", "10.1.1.1", "--model", "m",
        "--block-size", "64", "--num-blocks", "10", "--kv-events-endpoint", "",
        "--replay-endpoint", "tcp://*:5559", "--replay-format", "old", "--topic", "t",
        "--event-encoding", "array", "--buffer-steps", "5", "--max-num-seqs", "2",
        "--prefill-tokens-per-s", "1000", "--decode-ms-per-token", "0", "--seed", "7",
        "--count", "3",
    )  # fmt: skip
    assert opts == MockVllmOptions(
        host="10.0.0.5",
        port=9000,
        advertise_host="10.1.1.1",
        model="m",
        block_size=64,
        num_blocks=10,
        kv_events_endpoint="",
        replay_endpoint="tcp://*:5559",
        replay_format="old",
        topic="t",
        event_encoding="array",
        buffer_steps=5,
        max_num_seqs=2,
        prefill_tokens_per_s=1000.0,
        decode_ms_per_token=0.0,
        seed=7,
        count=3,
    )


def test_unknown_encoding_is_refused() -> None:
    with pytest.raises(SystemExit):
        parse("--event-encoding", "cbor")


@pytest.mark.parametrize(
    ("endpoint", "index", "expected"),
    [
        ("tcp://*:5557", 0, "tcp://*:5557"),
        ("tcp://*:5557", 2, "tcp://*:5559"),
        ("tcp://127.0.0.1:0", 3, "tcp://127.0.0.1:0"),
        ("inproc://kv", 1, "inproc://kv_1"),
        (None, 1, None),
        ("", 1, ""),
    ],
)
def test_offset_endpoint(endpoint: str | None, index: int, expected: str | None) -> None:
    assert offset_endpoint(endpoint, index) == expected
