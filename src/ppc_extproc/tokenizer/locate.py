"""Where a model's tokenizer files are on disk, found without any flag.

For a served model name (``Qwen/Qwen3-8B``), in order:

1. an explicit directory: ``local.tokenizers[model]`` (a directory, or its ``tokenizer.json``),
   else ``local.tokenizerPath`` (every model);
2. each configured flat cache (llm-d's ``tokenizersCacheDir``: ``<dir>/<org>/<name>/``, the
   layout ``github.com/daulet/tokenizers`` ``FromPretrained`` downloads to);
3. the Hugging Face hub cache, read offline as ``huggingface_hub`` lays it out:
   ``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``, then
   ``models--ORG--NAME/snapshots/<contents of refs/main>/``.

Model names come from clients: only names shaped like a Hugging Face repo id are looked up, so a
name can never reach outside the cache directories. Nothing here reads a file's content except
``refs/main``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["TokenizerLocator", "hub_cache_dir", "hub_snapshot"]

#: ``huggingface_hub``'s repo-id rule: one optional namespace, names of word characters, ``-``,
#: ``.``; no ``--`` or ``..`` (``huggingface_hub/utils/_validators.py`` ``validate_repo_id``).
_REPO_ID = re.compile(r"^(?:[\w.\-]{1,96}/)?[\w.\-]{1,96}$")
_REVISION = re.compile(r"^[\w.\-]{1,128}$")
TOKENIZER_FILE = "tokenizer.json"


def _valid_repo_id(model: str) -> bool:
    return bool(_REPO_ID.match(model)) and "--" not in model and ".." not in model and not model.startswith((".", "-"))


def hub_cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """The hub cache ``huggingface_hub`` uses: ``HF_HUB_CACHE``, ``HF_HOME/hub``, ``~/.cache/huggingface/hub``."""
    env = os.environ if env is None else env
    if env.get("HF_HUB_CACHE"):
        return Path(env["HF_HUB_CACHE"]).expanduser()
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]).expanduser() / "hub"
    return Path(env.get("HOME") or Path.home()) / ".cache" / "huggingface" / "hub"


def hub_snapshot(hub: Path, model: str) -> Path | None:
    """``<hub>/models--ORG--NAME/snapshots/<refs/main>/`` when it holds a ``tokenizer.json``."""
    if not _valid_repo_id(model):
        return None
    repo = hub / ("models--" + model.replace("/", "--"))
    try:
        revision = (repo / "refs" / "main").read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    if not _REVISION.match(revision) or revision in (".", ".."):
        return None
    snapshot = repo / "snapshots" / revision
    return snapshot if (snapshot / TOKENIZER_FILE).is_file() else None


def _directory(path: str) -> Path:
    """A configured location: a model directory, or the ``tokenizer.json`` inside one."""
    p = Path(path).expanduser()
    return p.parent if p.name == TOKENIZER_FILE or p.is_file() else p


@dataclass(frozen=True, slots=True)
class TokenizerLocator:
    """Finds a model's tokenizer directory (see the module docstring)."""

    #: ``local.tokenizerPath``: the directory for every model not in ``per_model``.
    default_path: str = ""
    #: ``local.tokenizers``: served model name → directory (or its ``tokenizer.json``).
    per_model: Mapping[str, str] = field(default_factory=dict)
    #: Flat caches (``<dir>/<model>/``), searched before the hub cache.
    flat_caches: Sequence[str] = ()
    #: Read the Hugging Face hub cache (resolved from the environment at each lookup).
    hub: bool = True
    env: Mapping[str, str] | None = None

    def explicit(self, model: str) -> Path | None:
        """The configured directory for ``model``, if any (not checked)."""
        if model in self.per_model:
            return _directory(self.per_model[model])
        return _directory(self.default_path) if self.default_path else None

    def find(self, model: str) -> tuple[Path, str] | None:
        """``(directory, source)`` with source ``path``, ``cache`` or ``hf_cache``; None if nowhere."""
        explicit = self.explicit(model)
        if explicit is not None:
            return explicit, "path"
        if not _valid_repo_id(model):
            return None
        for cache in self.flat_caches:
            candidate = Path(cache).expanduser() / model
            if (candidate / TOKENIZER_FILE).is_file():
                return candidate, "cache"
        if self.hub:
            snapshot = hub_snapshot(hub_cache_dir(self.env), model)
            if snapshot is not None:
                return snapshot, "hf_cache"
        return None
