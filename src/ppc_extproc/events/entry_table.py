"""The (tier, group) entries each endpoint owns: bounded, and a bound that degrades, never
switches an endpoint off.

Every distinct (tier, group) an endpoint stores in owns a bit of every index mask, so the number
per endpoint is bounded. When the table is full, a GPU-tier entry (the full-attention groups that
prefix routing runs on: events of other group kinds never get this far) is always admitted: the
least used entry of another tier makes room (failing that, the least used GPU entry). A new entry
of another tier is refused (``too_many_entries``) until the table empties: AllBlocksCleared, a
confirmed engine restart, or the endpoint leaving the pool reset it.

Not thread-safe: driven by the ingestion thread only.
"""

from __future__ import annotations

from dataclasses import dataclass

from ppc_extproc.ids import EndpointId
from ppc_extproc.index import PodEntry

__all__ = ["GPU_TIER", "EntryTable"]

#: The tier of ``medium`` "GPU" (or no medium).
GPU_TIER = "gpu"

_Key = tuple[str, int | None]  # (tier, group)


@dataclass(slots=True)
class _Slot:
    entry: PodEntry
    uses: int = 0


class EntryTable:
    """Per endpoint: its (tier, group) → entry, with use counts."""

    def __init__(self, bound: int) -> None:
        self.bound = bound
        self._table: dict[str, dict[_Key, _Slot]] = {}

    def get(self, endpoint: str, tier: str, group: int | None) -> PodEntry | None:
        """The entry if the endpoint owns it (counts a use)."""
        table = self._table.get(endpoint)
        slot = table.get((tier, group)) if table is not None else None
        if slot is None:
            return None
        slot.uses += 1
        return slot.entry

    def admit(self, endpoint: str, tier: str, group: int | None) -> tuple[PodEntry | None, PodEntry | None]:
        """``(entry, evicted)`` for a (tier, group) the endpoint does not own yet: ``entry`` None
        when it is refused; ``evicted`` the entry that made room (the caller releases it)."""
        table = self._table.setdefault(endpoint, {})
        evicted = None
        if len(table) >= self.bound:
            if tier != GPU_TIER:
                return None, None
            others = [k for k in table if k[0] != GPU_TIER] or list(table)
            victim = min(others, key=lambda k: table[k].uses)
            evicted = table.pop(victim).entry
        entry = PodEntry(EndpointId(endpoint), tier, group=group)
        table[(tier, group)] = _Slot(entry, 1)
        return entry, evicted

    def export(self, endpoint: str) -> list[tuple[str, int | None, int]]:
        """(tier, group, uses) of each entry the endpoint owns (a warm-restart snapshot)."""
        return [(tier, group, slot.uses) for (tier, group), slot in self._table.get(endpoint, {}).items()]

    def restore(self, endpoint: str, tier: str, group: int | None, uses: int) -> PodEntry | None:
        """Own an entry again from a snapshot (None when the table is full)."""
        table = self._table.setdefault(endpoint, {})
        if (tier, group) not in table and len(table) >= self.bound:
            return None
        entry = PodEntry(EndpointId(endpoint), tier, group=group)
        table[(tier, group)] = _Slot(entry, uses)
        return entry

    def reset(self, endpoint: str) -> None:
        """Forget what the endpoint owns (its index entries are gone)."""
        self._table.pop(endpoint, None)

    def __len__(self) -> int:
        return sum(len(t) for t in self._table.values())

    def owned(self, endpoint: str) -> int:
        table = self._table.get(endpoint)
        return len(table) if table is not None else 0

    def to_json(self) -> dict[str, list[dict[str, object]]]:
        """Per endpoint, its entries with their use counts, most used first (``/debug/state``)."""
        return {
            endpoint: [
                {"tier": tier, "group": group, "uses": slot.uses}
                for (tier, group), slot in sorted(list(table.items()), key=lambda kv: -kv[1].uses)
            ]
            for endpoint, table in list(self._table.items())
        }
