"""Pod entries and their bit numbers.

An index entry is the whole tuple ``(endpoint, tier, speculative, group)`` (llm-d's ``PodEntry``).
The index stores, per request key, the *set* of entries as an int bitmask: each distinct entry owns
one bit. A fleet has few distinct entries (endpoints × tiers × groups, plus one speculative entry per
endpoint), so a mask is a small int, set operations are single int operations, and candidate
filtering is one ``&``. Bits of a deleted endpoint are recycled once its entries are cleared.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ppc_extproc.ids import EndpointId

__all__ = ["DEFAULT_TIER_WEIGHTS", "SPECULATIVE_TIER", "EntryRegistry", "MaskInfo", "PodEntry"]

#: Tier of a speculative entry; it weighs 1.0 like any tier not listed in the weights.
SPECULATIVE_TIER = ""
#: ``kvCacheBackendConfigs`` defaults.
DEFAULT_TIER_WEIGHTS: Mapping[str, float] = {"gpu": 1.0, "cpu": 0.8}
_MASK_INFO_CACHE_LIMIT = 65536


@dataclass(frozen=True, slots=True)
class PodEntry:
    """Where a block is held: the endpoint, its device tier, whether speculative, and the HMA group."""

    endpoint: EndpointId
    tier: str = "gpu"
    speculative: bool = False
    group: int | None = None

    def __str__(self) -> str:
        text = f"{self.endpoint}@{self.tier}"
        if self.speculative:
            text += "[speculative]"
        if self.group is not None:
            text += f"[group={self.group}]"
        return text

    @property
    def tier_label(self) -> str:
        """The tier name reported in ``cachedBlocksByTier`` (speculative entries count apart)."""
        return "speculative" if self.speculative else self.tier


@dataclass(frozen=True, slots=True)
class MaskInfo:
    """What an entry mask means for scoring: per endpoint, its best tier weight and its tiers."""

    #: endpoint → max tier weight among its entries in the mask
    weights: dict[EndpointId, float]
    #: (endpoint, tier label) pairs present in the mask
    tiers: frozenset[tuple[EndpointId, str]]
    #: True when every weight is exactly 1.0 (scores then stay exact integers)
    unit_weights: bool
    #: Every bit of the endpoints in the mask, their entries outside it too (a prefix walk keeps
    #: only these endpoints once it has passed this mask)
    endpoints_mask: int


class EntryRegistry:
    """Assigns bits to pod entries and answers questions about masks. Not thread-safe on its own:
    the index calls it under its lock."""

    def __init__(self, tier_weights: Mapping[str, float] | None = None) -> None:
        self.tier_weights: dict[str, float] = dict(
            DEFAULT_TIER_WEIGHTS if tier_weights is None else tier_weights
        )
        self._bit_of: dict[PodEntry, int] = {}
        self._entry_of: dict[int, PodEntry] = {}
        self._endpoint_mask: dict[EndpointId, int] = {}
        self._free_bits: list[int] = []
        self._next_bit = 0
        self._mask_info: dict[int, MaskInfo] = {}

    def weight(self, tier: str) -> float:
        """Weight of a tier; unlisted tiers (speculative "", "storage", …) weigh 1.0."""
        return self.tier_weights.get(tier, 1.0)

    def bit(self, entry: PodEntry) -> int:
        """The bit of ``entry``, allocated on first use."""
        bit = self._bit_of.get(entry)
        if bit is None:
            bit = self._free_bits.pop() if self._free_bits else self._next_bit
            if bit == self._next_bit:
                self._next_bit += 1
            self._bit_of[entry] = bit
            self._entry_of[bit] = entry
            self._endpoint_mask[entry.endpoint] = self._endpoint_mask.get(entry.endpoint, 0) | (
                1 << bit
            )
            self._mask_info.clear()
        return bit

    def mask(self, entries: Iterable[PodEntry]) -> int:
        """Mask of several entries (allocating bits as needed)."""
        mask = 0
        for entry in entries:
            mask |= 1 << self.bit(entry)
        return mask

    def known_mask(self, entries: Iterable[PodEntry]) -> int:
        """Mask of the entries that already own a bit (never allocates)."""
        mask = 0
        for entry in entries:
            bit = self._bit_of.get(entry)
            if bit is not None:
                mask |= 1 << bit
        return mask

    def endpoint_mask(self, endpoint: str) -> int:
        """All bits of one endpoint's entries."""
        return self._endpoint_mask.get(EndpointId(endpoint), 0)

    def endpoints_mask(self, endpoints: Iterable[str]) -> int:
        """All bits of several endpoints' entries (the candidate filter of a lookup)."""
        mask = 0
        get = self._endpoint_mask.get
        for endpoint in endpoints:
            mask |= get(EndpointId(endpoint), 0)
        return mask

    def entries(self, mask: int) -> list[PodEntry]:
        """The entries whose bits are set in ``mask``, in bit order."""
        found = []
        while mask:
            low = mask & -mask
            found.append(self._entry_of[low.bit_length() - 1])
            mask ^= low
        return found

    def info(self, mask: int) -> MaskInfo:
        """Scoring view of a mask (memoised: chains repeat the same few masks)."""
        info = self._mask_info.get(mask)
        if info is None:
            weights: dict[EndpointId, float] = {}
            tiers = set()
            for entry in self.entries(mask):
                w = self.weight(entry.tier)
                if w > weights.get(entry.endpoint, -1.0):
                    weights[entry.endpoint] = w
                tiers.add((entry.endpoint, entry.tier_label))
            info = MaskInfo(weights, frozenset(tiers), all(w == 1.0 for w in weights.values()),
                            self.endpoints_mask(weights))
            if len(self._mask_info) >= _MASK_INFO_CACHE_LIMIT:
                self._mask_info.clear()
            self._mask_info[mask] = info
        return info

    def release_endpoint(self, endpoint: str) -> int:
        """Forget an endpoint's entries and recycle their bits. The caller must have removed those
        bits from every stored mask first. Returns the released mask."""
        mask = self._endpoint_mask.pop(EndpointId(endpoint), 0)
        for entry in self.entries(mask):
            bit = self._bit_of.pop(entry)
            del self._entry_of[bit]
            self._free_bits.append(bit)
        if mask:
            self._mask_info.clear()
        return mask

    def release(self, entry: PodEntry) -> int:
        """Forget one entry and recycle its bit (the caller removed the bit from every stored mask
        first). Returns the released mask (0 if the entry owned no bit)."""
        bit = self._bit_of.pop(entry, None)
        if bit is None:
            return 0
        del self._entry_of[bit]
        self._free_bits.append(bit)
        endpoint_mask = self._endpoint_mask.get(entry.endpoint, 0) & ~(1 << bit)
        if endpoint_mask:
            self._endpoint_mask[entry.endpoint] = endpoint_mask
        else:
            self._endpoint_mask.pop(entry.endpoint, None)
        self._mask_info.clear()
        return 1 << bit

    def known(self) -> list[PodEntry]:
        """Every entry that owns a bit."""
        return list(self._bit_of)

    def __len__(self) -> int:
        return len(self._bit_of)
