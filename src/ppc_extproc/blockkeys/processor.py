"""Token processor: tokens of a prompt → chained request keys (only full blocks)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence

from ppc_extproc import native
from ppc_extproc.blockkeys.config import TokenProcessorConfig
from ppc_extproc.blockkeys.hashing import BlockExtras, Hasher, hasher_for
from ppc_extproc.ids import RequestKey
from ppc_extproc.tokens.le32 import tokens_to_le32

__all__ = ["TokenProcessor"]

_ROOT_CACHE_LIMIT = 4096
#: Bounds of the recent prompts kept for ``keys(..., recent=True)``: prompts, and keys in all
#: (≈ 40 B each, ints the index mostly holds anyway, plus 4 × block size bytes of tokens).
_RECENT_LISTS = 256
_RECENT_KEYS = 131_072


class TokenProcessor:
    """Computes llm-d request keys: ``key[i] = H(key[i-1] or root(model), block_i, extras_i)``.

    Tokens are given as little-endian uint32 bytes (what the request path extracts from JSON without
    creating Python ints) or as a sequence of ints. The trailing partial block is dropped.
    """

    def __init__(self, config: TokenProcessorConfig | None = None) -> None:
        self.config = config or TokenProcessorConfig()
        self.block_size = self.config.block_size_tokens
        self._hasher: Hasher = hasher_for(self.config.hash_algorithm)
        self._init_hash = self._hasher.init_hash(self.config.hash_seed)
        self._roots: dict[str, int] = {}
        self._roots_lock = threading.Lock()
        #: (root, first block's token bytes) → the latest prompt starting so: its token bytes
        #: and key list.
        self._recent: OrderedDict[tuple[int, bytes], tuple[bytes, list[int]]] = OrderedDict()
        self._recent_keys = 0
        self._recent_lock = threading.Lock()

    @property
    def algorithm(self) -> str:
        return self._hasher.name

    def root(self, model: str) -> int:
        """The parent of block 0 for ``model`` (the LoRA adapter name when one is used)."""
        root = self._roots.get(model)
        if root is None:
            root = self._hasher.root(self._init_hash, model)
            with self._roots_lock:
                if len(self._roots) >= _ROOT_CACHE_LIMIT:
                    self._roots.clear()
                self._roots[model] = root
        return root

    def num_blocks(self, tokens_le32: bytes | memoryview) -> int:
        """Number of full blocks in little-endian uint32 token bytes."""
        return len(tokens_le32) // (4 * self.block_size)

    def keys(
        self,
        tokens: bytes | bytearray | memoryview | Sequence[int],
        model: str,
        *,
        parent: int = 0,
        extras: Sequence[BlockExtras] | None = None,
        recent: bool = False,
    ) -> list[RequestKey]:
        """Request keys of every full block of ``tokens``; ``parent`` 0 starts from the model's root.

        ``recent`` (the request path): the leading blocks whose tokens equal those of the latest
        prompt that began with the same block are not hashed again. Their keys are that prompt's
        int objects, so the index's probes match them by identity (the index stores the objects
        its first writer gave: the speculative seeding of that prompt) instead of comparing
        against a stored key that is not in the CPU cache. A prompt equal to the previous one gets
        the very list that prompt got: callers never mutate the lists returned."""
        data = memoryview(tokens) if isinstance(tokens, (bytes, bytearray, memoryview)) else tokens_to_le32(tokens)
        n_blocks = len(data) // (4 * self.block_size)
        if n_blocks == 0:
            return []
        start = parent if parent else self.root(model)
        if not recent or extras is not None:
            return self._hasher.chain(start, data, self.block_size, n_blocks, extras)  # type: ignore[return-value]
        head = (start, bytes(data[: 4 * self.block_size]))
        with self._recent_lock:
            previous = self._recent.get(head)
        if previous is None:
            keys = self._hasher.chain(start, data, self.block_size, n_blocks, None, None)
        else:
            # The blocks whose tokens equal the previous prompt's have its keys: hash from the
            # first block that differs, on the last shared key.
            previous_tokens, previous_keys = previous
            shared = min(native.common_prefix(data, 0, previous_tokens, 0) // (4 * self.block_size),
                         n_blocks, len(previous_keys))  # fmt: skip
            # A prompt equal to the previous one takes its very list: a copy would touch every
            # key object again (one refcount write each, 6,250 cache lines at 100K tokens).
            keys = previous_keys if shared == len(previous_keys) == n_blocks else previous_keys[:shared]
            if shared < n_blocks:
                parent_key = previous_keys[shared - 1] if shared else start
                rest = data[4 * self.block_size * shared :]
                keys += self._hasher.chain(parent_key, rest, self.block_size, n_blocks - shared, None, None)
        kept = tokens if type(tokens) is bytes else bytes(data)
        with self._recent_lock:
            old = self._recent.pop(head, None)
            self._recent_keys += len(keys) - (len(old[1]) if old is not None else 0)
            self._recent[head] = (kept, keys)
            while len(self._recent) > _RECENT_LISTS or (self._recent_keys > _RECENT_KEYS and len(self._recent) > 1):
                _, (_, dropped) = self._recent.popitem(last=False)
                self._recent_keys -= len(dropped)
        return keys  # type: ignore[return-value]
