"""The command line: ``ppc-extproc serve | check-config | keys | plugins``, llm-d's chart arguments
(``llmd``), and the argument types every command shares (``args``); ``demo`` and ``mock-vllm``
are handed to the lab."""

from ppc_extproc.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
