"""The tiny tokenizer directory, built once per session (no download, no shipped model)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ppc_extproc.tokenizer import LocalTokenizer
from ppc_extproc_lab.tiny_tokenizer import build_tiny_tokenizer


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_tokenizer(tmp_path_factory.mktemp("tiny-tokenizer"))


@pytest.fixture(scope="session")
def local(tiny_dir: Path) -> LocalTokenizer:
    return LocalTokenizer.from_dir(tiny_dir)


@pytest.fixture(scope="session")
def hf_tok(tiny_dir: Path):  # type: ignore[no-untyped-def]
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(str(tiny_dir))
