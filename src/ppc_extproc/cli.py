"""``ppc-extproc`` command line: serve, demo, mock-vllm, keys."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import orjson

from ppc_extproc import __version__
from ppc_extproc.blockkeys import TokenProcessor, TokenProcessorConfig
from ppc_extproc.blockkeys.config import HASH_ALGORITHMS

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
    from ppc_extproc.mock_vllm import cli as mock_cli

    p = sub.add_parser(
        "mock-vllm",
        help="run mock vLLM engines (vLLM's HTTP API and KV events, with a simple time model)",
        description="A stand-in for vLLM pods: OpenAI completions on token prompts, a bounded "
        "prefix cache, KV events over ZMQ byte for byte as vLLM publishes them.",
    )
    mock_cli.add_arguments(p)
    p.set_defaults(handler=mock_cli.main)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ppc-extproc",
        description="Envoy ext_proc endpoint picker that routes LLM requests to the pod holding "
        "the longest cached KV prefix.",
    )
    parser.add_argument("--version", action="version", version=f"ppc-extproc {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_mock_vllm(sub)
    _add_keys(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 0
    return int(handler(args))


if __name__ == "__main__":
    sys.exit(main())
