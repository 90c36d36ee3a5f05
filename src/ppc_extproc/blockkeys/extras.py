"""Per-block extras: multimodal identifiers, ``cache_salt`` and the event-side ``extra_keys``.

Request side (``compute_block_extras`` + ``fold_cache_salt``) and event side
(``parse_raw_extra_keys`` + ``realign_extras``) must produce the same identifiers for the same
block, or keys never match (``llm-d/llm-d-router: pkg/kvcache/kvblock/token_processor.go``,
``pkg/kvevents/``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ppc_extproc.tokens.prompt import MultimodalFeature

__all__ = [
    "MultimodalFeature",
    "compute_block_extras",
    "fold_cache_salt",
    "parse_raw_extra_keys",
    "realign_extras",
]

Extras = list[tuple[str, ...] | None]


def compute_block_extras(
    features: Sequence[MultimodalFeature], block_size: int, num_tokens: int
) -> Extras | None:
    """Identifiers of the items overlapping each full block, in start-offset order (stable)."""
    if not features or block_size <= 0 or num_tokens <= 0:
        return None
    items = sorted(features, key=lambda f: f.offset)  # sorted() is stable, unlike llm-d's sort
    n_blocks = num_tokens // block_size
    extras: Extras = []
    for k in range(n_blocks):
        start, end = k * block_size, (k + 1) * block_size
        ids = tuple(f.hash for f in items if f.offset + f.length > start and f.offset < end)
        extras.append(ids or None)
    return extras


def fold_cache_salt(extras: Extras | None, salt: str | None, n_blocks: int) -> Extras | None:
    """Append a non-empty ``cache_salt`` to block 0's extras, after any multimodal ids."""
    if not salt or n_blocks <= 0:
        return extras
    folded: Extras = list(extras) if extras is not None else [None] * n_blocks
    folded[0] = (*(folded[0] or ()), salt)
    return folded


def parse_raw_extra_keys(raw: Any, lora_name: str | None) -> Extras | None:
    """``BlockStored.extra_keys`` → identifiers per engine block.

    A string is an identifier (multimodal id or salt); a list whose first element is a string is
    ``[identifier, offset]``; other types (int LoRA ids, bytes prompt-embeds digests) are skipped.
    A leading element equal to ``lora_name`` is the LoRA adapter, not an identifier (llm-d #2927).
    Raises TypeError when the field is neither a list nor None, or an entry neither list nor None.
    """
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise TypeError("extra_keys must be a list or nil")
    parsed: Extras = []
    for entry in raw:
        if entry is None:
            parsed.append(None)
            continue
        if not isinstance(entry, (list, tuple)):
            raise TypeError("extra_keys entries must be lists or nil")
        elements = list(entry)
        if lora_name and elements and elements[0] == lora_name:
            elements = elements[1:]
        ids: list[str] = []
        for element in elements:
            if isinstance(element, str):
                ids.append(element)
            elif isinstance(element, (list, tuple)) and element and isinstance(element[0], str):
                ids.append(element[0])
        parsed.append(tuple(ids) or None)
    return parsed


def realign_extras(engine_extras: Extras | None, n_canonical: int) -> Extras | None:
    """Map per-engine-block extras onto canonical blocks (engine block size may differ).

    Engine blocks larger than canonical ones: ``canonical[i] = engine[i*E // C]``. Smaller: engine
    block ``j`` contributes to ``canonical[j*C // E]``; identifiers are de-duplicated keeping the
    first occurrence, which equals the request side's start-offset order.
    """
    if engine_extras is None or n_canonical == 0:
        return None
    n_engine = len(engine_extras)
    if n_engine == 0:
        return None
    if n_engine == n_canonical:
        return list(engine_extras)
    if n_engine < n_canonical:
        return [engine_extras[i * n_engine // n_canonical] for i in range(n_canonical)]
    merged: list[list[str]] = [[] for _ in range(n_canonical)]
    for j, ids in enumerate(engine_extras):
        if ids:
            target = merged[j * n_canonical // n_engine]
            target.extend(i for i in ids if i not in target)
    return [tuple(ids) or None for ids in merged]
