"""``ModelTokenizers``: one :class:`LocalTokenizer` per served model, found and loaded on first use.

Model names come from clients, so every table here is bounded: at most ``max_models`` models are
remembered (least recently used forgotten first) and at most ``max_loaded`` tokenizers are kept in
memory. A model whose tokenizer was not found is looked up again after ``retry_seconds`` (a cache
filled after start-up is picked up). Loading runs in a worker thread, once per model at a time;
the requests that arrive meanwhile wait for it. Single event loop.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from ppc_extproc.tokenizer.local import LocalTokenizer
from ppc_extproc.tokenizer.locate import TokenizerLocator
from ppc_extproc.tokenizer.segments import SegmentCache

__all__ = ["ModelEntry", "ModelTokenizers", "TokenizerOptions"]

log = structlog.get_logger(__name__)

DEFAULT_MAX_MODELS = 256
DEFAULT_MAX_LOADED = 8
DEFAULT_RETRY_SECONDS = 30.0


@dataclass(frozen=True, slots=True)
class TokenizerOptions:
    """What the engines were started with, applied to every loaded tokenizer."""

    #: The text of the engines' ``--chat-template`` (replaces the model's templates).
    chat_template: str | None = None
    #: ``--default-chat-template-kwargs`` (under each request's ``chat_template_kwargs``).
    default_chat_template_kwargs: Mapping[str, Any] = field(default_factory=dict)
    #: ``--trust-request-chat-template``.
    trust_request_chat_template: bool = False


@dataclass(slots=True)
class ModelEntry:
    """What is known about one model's tokenizer."""

    model: str
    tokenizer: LocalTokenizer | None = None
    directory: str = ""
    #: ``path``, ``cache``, ``hf_cache``, ``render`` (its engines render it), or ``none``.
    source: str = "none"
    #: Why the last load failed (a directory without a loadable tokenizer).
    error: str = ""
    #: When it was last looked up (monotonic seconds); None: look it up on the next request.
    checked_at: float | None = None
    #: outcome → requests of this model
    outcomes: dict[str, int] = field(default_factory=dict)
    warned: bool = False
    loading: asyncio.Future[LocalTokenizer | None] | None = None

    def count(self, outcome: str) -> None:
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1

    def view(self) -> dict[str, Any]:
        out: dict[str, Any] = {"source": self.source, "outcomes": dict(self.outcomes)}
        if self.directory:
            out["directory"] = self.directory
        if self.error:
            out["error"] = self.error
        return out


class ModelTokenizers:
    """Per-model tokenizers (see the module docstring)."""

    def __init__(
        self,
        locator: TokenizerLocator,
        *,
        options: TokenizerOptions | None = None,
        cache: SegmentCache | None = None,
        max_models: int = DEFAULT_MAX_MODELS,
        max_loaded: int = DEFAULT_MAX_LOADED,
        retry_seconds: float = DEFAULT_RETRY_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_models < 1 or max_loaded < 1:
            raise ValueError("max_models and max_loaded must be >= 1")
        self.locator = locator
        self.options = options or TokenizerOptions()
        self.cache = cache
        self.max_models = max_models
        self.max_loaded = max_loaded
        self.retry_seconds = retry_seconds
        self._clock = clock
        self._entries: OrderedDict[str, ModelEntry] = OrderedDict()
        #: ``local.tokenizerPath``'s tokenizer, loaded once for every model not mapped by name.
        self.default: LocalTokenizer | None = None

    def load(self, directory: str | Path) -> LocalTokenizer:
        """Load ``directory`` with the configured options (raises ``OSError`` / ``ValueError``)."""
        opts = self.options
        return LocalTokenizer.from_dir(
            directory, cache=self.cache, cache_bytes=0,
            trust_request_chat_template=opts.trust_request_chat_template,
            default_chat_template_kwargs=opts.default_chat_template_kwargs, chat_template=opts.chat_template,
        )  # fmt: skip

    def entry(self, model: str) -> ModelEntry:
        """``model``'s entry (created, and marked most recently used)."""
        entry = self._entries.get(model)
        if entry is None:
            entry = self._entries[model] = ModelEntry(model)
            while len(self._entries) > self.max_models:
                self._entries.popitem(last=False)
        else:
            self._entries.move_to_end(model)
        return entry

    async def get(self, model: str) -> LocalTokenizer | None:
        """``model``'s tokenizer, found and loaded if need be; None when there is none."""
        entry = self.entry(model)
        if entry.tokenizer is not None:
            return entry.tokenizer
        if self.default is not None and model not in self.locator.per_model:
            entry.source, entry.directory = "path", self.locator.default_path
            return self.default
        if entry.loading is not None:
            return await asyncio.shield(entry.loading)
        if entry.checked_at is not None and self._clock() - entry.checked_at < self.retry_seconds:
            return None
        entry.checked_at = self._clock()
        found = self.locator.find(model)
        if found is None:
            entry.directory = ""
            return None
        directory, source = found
        future: asyncio.Future[LocalTokenizer | None] = asyncio.get_running_loop().create_future()
        entry.loading = future
        tokenizer: LocalTokenizer | None = None
        try:
            tokenizer = await asyncio.to_thread(self.load, directory)
            entry.error = ""
        except Exception as exc:  # a broken model directory: counted as no tokenizer, logged once per lookup
            entry.error = f"{type(exc).__name__}: {exc}"
            log.warning("tokenizer_load_failed", model=model, directory=str(directory), error=entry.error)
        finally:
            entry.loading = None
            entry.tokenizer, entry.directory = tokenizer, str(directory)
            entry.source = source if tokenizer is not None else "none"
            if not future.done():
                future.set_result(tokenizer)
        if tokenizer is not None:
            log.info("tokenizer_loaded", model=model, directory=str(directory), source=source)
            self._trim_loaded(keep=entry)
        return tokenizer

    def _trim_loaded(self, keep: ModelEntry) -> None:
        loaded = [e for e in self._entries.values() if e.tokenizer is not None]
        for entry in loaded[: max(0, len(loaded) - self.max_loaded)]:
            if entry is not keep:
                entry.tokenizer, entry.checked_at = None, None  # reloaded on its next request

    def models(self) -> dict[str, dict[str, Any]]:
        """Every remembered model's entry, most recently used last (for ``/debug/state``)."""
        return {name: e.view() for name, e in self._entries.items()}
