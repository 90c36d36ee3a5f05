"""Entry recency within one request key's mask, for ``podCacheSize``.

llm-d's ``PodCache`` is an exact LRU of entries per key: re-adding an entry refreshes it, and a key
over ``podCacheSize`` drops its least recently added entry (``llm-d/llm-d-router:
pkg/kvcache/kvblock/in_memory.go``). The index stores a key's entries as an int mask, so the order
costs nothing when it is the bit order (the lowest bit the oldest), which is how most keys fill.
A key whose entries arrived in another order stores an ``OrderedMask`` instead: an int equal to the
mask that also carries the order. Those are interned — a prompt's keys share a few orders — so a
key pays no memory for its order, and every reader that only does int operations on masks is
unaffected.
"""

from __future__ import annotations

__all__ = ["OrderedMask", "add", "order_of", "restrict"]

#: Bound on interned orders; past it the table starts over (masks already stored stay valid).
_INTERN_LIMIT = 65536


class OrderedMask(int):
    """An entry mask whose entries are not in bit order: ``order`` lists its bit numbers, least
    recently added first. Equal only to an ``OrderedMask`` of the same mask and order (a plain
    int mask means bit order), so maps keyed by masks keep the orders apart."""

    order: tuple[int, ...]

    def __eq__(self, other: object) -> bool:
        return (
            type(other) is OrderedMask and int.__eq__(self, other) and self.order == other.order
        )

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    __hash__ = int.__hash__

    def __repr__(self) -> str:
        return f"OrderedMask({int(self)}, order={self.order})"


_interned: dict[tuple[int, ...], OrderedMask] = {}
#: ``add``'s results for masks not in bit order (or several entries added at once).
_added: dict[tuple[int, tuple[int, ...], int], int] = {}


def order_of(mask: int) -> tuple[int, ...]:
    """Bit numbers of ``mask``, least recently added first."""
    if type(mask) is OrderedMask:
        return mask.order
    bits = []
    while mask:
        low = mask & -mask
        bits.append(low.bit_length() - 1)
        mask ^= low
    return tuple(bits)


def _make(order: tuple[int, ...] | list[int]) -> int:
    """The stored form of an order: a plain int when it is ascending, else an interned
    ``OrderedMask``."""
    mask = 0
    ascending = True
    previous = -1
    for bit in order:
        mask |= 1 << bit
        if bit < previous:
            ascending = False
        previous = bit
    if ascending:
        return mask
    key = tuple(order)
    found = _interned.get(key)
    if found is None:
        if len(_interned) >= _INTERN_LIMIT:
            _interned.clear()
        found = OrderedMask(mask)
        found.order = key
        _interned[key] = found
    return found


def add(mask: int | None, adding: tuple[int, ...], limit: int) -> int:
    """``mask`` after adding the bit numbers ``adding`` in that order (each becomes the most
    recent, present or not), keeping the ``limit`` most recent entries."""
    if mask is None:
        if len(adding) == 1:
            return 1 << adding[0]
        order: list[int] = []
    elif type(mask) is not OrderedMask and adding[0] >= mask.bit_length() - 1 and len(adding) == 1:
        # Bit order stays bit order: the new or re-added entry is the highest bit.
        new = mask | 1 << adding[0]
        excess = new.bit_count() - limit
        while excess > 0:
            new ^= new & -new
            excess -= 1
        return new
    else:
        # KV events write a few keys per call, often with the same few masks: remember results.
        memo_key = (mask, adding, limit)
        found = _added.get(memo_key)
        if found is not None:
            return found
        order = list(order_of(mask))
    for bit in adding:
        if bit in order:
            order.remove(bit)
        order.append(bit)
    if len(order) > limit:
        del order[: len(order) - limit]
    new = _make(order)
    if mask is not None:
        if len(_added) >= _INTERN_LIMIT:
            _added.clear()
        _added[memo_key] = new
    return new


def restrict(mask: int, keep: int) -> int:
    """``mask & keep`` with the order of what is left (0 when nothing is)."""
    if type(mask) is not OrderedMask:
        return mask & keep
    return _make([bit for bit in mask.order if keep >> bit & 1])
