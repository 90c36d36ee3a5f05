"""A bounded map with approximate LRU eviction in two generations.

Exact LRU costs an OrderedDict node (~50 bytes) per key and a relink on every touch. The index holds
millions of keys, so it uses two plain tables instead: new and touched keys live in ``young``; when
``young`` reaches half the capacity it becomes ``old`` and the previous ``old`` is evicted whole.
A key read from ``old`` moves back to ``young``. Every key touched within the last ``capacity / 2``
insertions survives; at most ``capacity`` keys are held.

The evicted generation is released incrementally, so no single call pays for dropping half the map:
every write releases twice as many evicted items as it wrote keys (plus a few), so a generation
is gone well before the next one is evicted — a fixed number of items per write call would fall
behind when one call writes many keys (a 64-block KV event) and let evicted generations pile up.
Should one still be pending at the next eviction (a read-heavy phase that promotes many keys), it
is dropped at once: evicted memory never exceeds one generation.

The generations are ``native.U64Map`` tables (uint64 keys stored inline: no int object per key,
a probe reads no Python object) when the C extension is built, else plain dicts; keys are then
ints in [0, 2^64). Both give the same results (``tests/unit/test_lru.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Generic, Protocol, TypeVar, cast

from ppc_extproc import native
from ppc_extproc.ids import MASK64
from ppc_extproc.index.recency import restrict

__all__ = ["TwoGenerationLRU"]

K = TypeVar("K")
V = TypeVar("V")

#: Evicted items released per write call, and per key written (see the module docstring).
_RELEASE_PER_CALL = 4
_RELEASE_PER_KEY = 2
#: Below this many keys a plain loop beats the bulk path's setup.
_BULK_MIN_KEYS = 32


class Table(Protocol[K, V]):
    """A generation: ``dict`` or ``native.U64Map`` (the subset of a dict's methods used here)."""

    def get(self, key: K, /) -> V | None: ...
    def pop(self, key: K, default: None, /) -> V | None: ...
    def popitem(self) -> tuple[K, V]: ...
    def __setitem__(self, key: K, value: V, /) -> None: ...
    def __contains__(self, key: object, /) -> bool: ...
    def __len__(self) -> int: ...
    def copy(self) -> Table[K, V]: ...
    def items(self) -> Iterable[tuple[K, V]]: ...
    def values(self) -> Iterable[V]: ...
    def update(self, other: Iterable[tuple[K, V]], /) -> None: ...


class NativeTable(Table[K, V], Protocol[K, V]):
    """``native.U64Map``: a generation plus the bulk operations written in C for it."""

    def get_many(self, keys: Sequence[K], /) -> list[V | None]: ...
    def fill(self, keys: Sequence[K], value: V, /) -> None: ...
    def swap_many(
        self,
        keys: Sequence[K],
        values: Sequence[V],
        start: int,
        old: Table[K, V] | None,
        limit: int,
        salt: int,
        previous: list[V | None],
        /,
    ) -> tuple[int, int]:
        """Sets ``keys[start:]`` (each ``(key ^ salt) & MASK64``) to ``values``, appending each
        key's previous value (this table's, else popped from ``old``, else None) to ``previous``,
        and stops after the write that brings the table to ``limit`` keys; returns the index to
        go on from and how many previous values were found."""
        ...

    def drop_some(self, n: int, /) -> int:
        """Drops up to ``n`` items (those ``popitem`` would release); returns how many."""
        ...

    def plan_for(self, n: int, /) -> None:
        """At most ``n`` keys will be held: the table prepares no growth past that."""
        ...


def default_table() -> Callable[[], Table[Any, Any]]:
    """The generations' type: ``native.U64Map`` when the extension is built, else ``dict``."""
    return native.U64Map if native.U64Map is not None else dict


class TwoGenerationLRU(Generic[K, V]):
    """Bounded mapping with approximate LRU eviction. Not thread-safe; callers lock.
    ``table``: the generations' type (``default_table()``; ``dict`` accepts any hashable key)."""

    def __init__(self, capacity: int, table: Callable[[], Table[K, V]] | None = None) -> None:
        if capacity < 2:
            raise ValueError("capacity must be at least 2")
        self.capacity = capacity
        self._generation_size = capacity // 2
        self._table: Callable[[], Table[K, V]] = table or default_table()
        #: Generations are ``native.U64Map`` (``NativeTable``): the bulk paths run in C.
        self._native = native.U64Map is not None and self._table is native.U64Map
        self._young = self._new_young()
        self._old = self._table()
        #: The evicted generation, being released (empty: none).
        self._retired = self._table()
        #: Keys dropped by eviction since creation (a metric).
        self.evicted = 0

    def get(self, key: K) -> V | None:
        """Value of ``key`` (None when absent), marking it recently used."""
        value = self._young.get(key)
        if value is None:
            value = self._old.pop(key, None)
            if value is not None:
                self._young[key] = value
                self._maybe_rotate()
        return value

    def get_prefix_runs(self, keys: Sequence[K]) -> list[tuple[V, int]]:
        """Values of the leading run of present keys (stops at the first absent one) as
        ``(value, count)`` runs, each key marked recently used: the bulk form of ``get`` for a
        prompt's chain of block keys. One C call per generation rotation
        (``native.prefix_runs``), and no list of a value per key."""
        pending = keys if isinstance(keys, list) else list(keys)
        walk = native.prefix_runs if self._native else native.py_prefix_runs
        found, end, done = walk(self._young, self._old, pending, 0, self._generation_size)
        while not done:  # young filled up: rotate exactly where single gets would, then go on
            self._maybe_rotate()
            more, end, done = walk(self._young, self._old, pending, end, self._generation_size)
            if found and more and found[-1][0] == more[0][0]:  # one run across the rotation
                found[-1] = (found[-1][0], found[-1][1] + more.pop(0)[1])
            found.extend(more)
        return found

    def peek(self, key: K) -> V | None:
        """Value of ``key`` without touching its recency."""
        value = self._young.get(key)
        return self._old.get(key) if value is None else value

    def __contains__(self, key: object) -> bool:
        return key in self._young or key in self._old

    def set(self, key: K, value: V) -> None:
        """Insert or replace ``key``, marking it recently used."""
        self._old.pop(key, None)
        self._young[key] = value
        self._maybe_rotate()
        if self._retired:
            self._release_some(1)

    def set_many(self, keys: Sequence[K], values: Sequence[V], salt: int = 0) -> list[V | None]:
        """``set`` for several keys at once; returns each key's previous value (or None).
        ``salt`` (int keys only): each key is ``(key ^ salt) & MASK64``, the index's scoped engine
        keys. On ``native.U64Map`` generations, one C call per generation rotation."""
        previous: list[V | None] = []
        if self._native:
            start, n = 0, min(len(keys), len(values))
            while start < n:
                old = self._old if self._old else None
                native_young = cast(NativeTable[K, V], self._young)
                start, _ = native_young.swap_many(keys, values, start, old, self._generation_size, salt, previous)
                if len(self._young) >= self._generation_size:
                    self._maybe_rotate()
            if self._retired:
                self._release_some(len(keys))
            return previous
        if salt:
            keys = [(key ^ salt) & MASK64 for key in keys]  # type: ignore[operator,misc]
        append = previous.append
        for key, value in zip(keys, values):
            young = self._young
            found = young.get(key)
            if found is None and self._old:
                found = self._old.pop(key, None)
            append(found)
            young[key] = value
            if len(young) >= self._generation_size:
                self._maybe_rotate()
        if self._retired:
            self._release_some(len(keys))
        return previous

    def or_bits(self, keys: Sequence[K], merge: Callable[[int | None], int]) -> None:
        """For int-mask values: ``value = merge(value)`` on every key (None for an absent key, which
        is inserted), marking each recently used. ``merge`` adds entries to a mask (the index's keeps
        their recency and the per-key bound: ``recency.add``); it runs once per distinct mask
        of a call, and a key whose mask it leaves as it was is not written.

        Long key lists (a prompt's speculative entries) go through bulk dict operations in C;
        short ones (a KV event's few blocks) through a plain loop, which is cheaper for them."""
        if len(keys) > _BULK_MIN_KEYS:
            self._or_bits_bulk(keys, merge)
            return
        memo: dict[int | None, int | None] = {}  # mask -> new mask, None when unchanged
        for key in keys:
            young = self._young
            value = young.get(key)
            promoted = False
            if value is None and self._old:
                value = self._old.pop(key, None)
                promoted = value is not None
            if value in memo:
                new = memo[value]
            else:
                new = _merged(value, merge)  # type: ignore[arg-type]
                memo[value] = new  # type: ignore[index]
            if new is None:
                if not promoted:
                    continue
                new = value  # type: ignore[assignment]  # moved to young, unchanged
            young[key] = new  # type: ignore[assignment]
            if len(young) >= self._generation_size:
                self._maybe_rotate()
        if self._retired:
            self._release_some(len(keys))

    def _or_bits_bulk(self, keys: Sequence[K], merge: Callable[[int | None], int]) -> None:
        for lo, hi in self._slices(len(keys)):
            chunk = keys[lo:hi]
            young = self._young
            current: list[V | None] = self._get_many(young, chunk)
            self._promote_from_old(chunk, current)
            if current.count(None) != len(current):  # some key is held (a C-level scan)
                # A prompt's keys hold few distinct masks: compute each new mask once, and touch
                # the dict only for keys whose mask changes (none when the prefix already has it).
                changed: dict[V | None, V] = {}
                for value in set(current):
                    new = _merged(value, merge)  # type: ignore[arg-type]
                    if new is not None:
                        changed[value] = new  # type: ignore[assignment]
                if changed:
                    native.remap(young, list(chunk), current, changed)
            else:  # every key is new: one C-level insert
                self._fill(young, chunk, merge(None))  # type: ignore[arg-type]  # V is the int mask here
            self._after_write(hi - lo)

    def _slices(self, n: int) -> Iterator[tuple[int, int]]:
        """Bounds of consecutive slices that each fit in the young generation's remaining room,
        so a bulk write rotates exactly where single writes would."""
        lo = 0
        while lo < n:
            room = max(1, self._generation_size - len(self._young))
            yield lo, min(n, lo + room)
            lo += room

    def _promote_from_old(self, keys: Sequence[K], values: list[V | None]) -> None:
        """Fill ``values`` for keys found in the old generation, moving them to the young one."""
        old = self._old
        if not old:
            return
        held = self._get_many(old, keys)
        if held.count(None) != len(held):
            young = self._young
            for i, value in enumerate(held):
                if value is not None and values[i] is None:
                    key = keys[i]
                    old.pop(key, None)
                    values[i] = value
                    young[key] = value

    def _after_write(self, written: int) -> None:
        if len(self._young) >= self._generation_size:
            self._maybe_rotate()
        if self._retired:
            self._release_some(written)

    def and_not_bits(self, keys: Sequence[K], bits: int) -> None:
        """For int-mask values: ``value &= ~bits`` on every present key without touching recency,
        dropping keys left empty. Each distinct mask is computed once."""
        for generation in (self._young, self._old):
            if not generation:
                continue
            current = self._get_many(generation, keys)
            changed: dict[V, V | None] = {}
            for value in set(current):
                if value is not None and value & bits:  # type: ignore[operator]
                    changed[value] = restrict(value, ~bits) or None  # type: ignore[arg-type,assignment]  # None: drop the key
            if changed:
                native.remap(generation, keys if isinstance(keys, list) else list(keys), current, changed)

    def copy_items(self) -> list[Table[K, V]]:
        """Shallow copies of both generations, old first (a consistent view, at C speed); each
        has ``items()``."""
        return [self._old.copy(), self._young.copy()]

    def update_many(self, keys: Sequence[K], values: Sequence[V]) -> None:
        """``set`` for many keys when their previous values do not matter (a bulk load): C-level
        dict updates, in slices that rotate where single writes would."""
        for lo, hi in self._slices(len(keys)):
            chunk = keys[lo:hi]
            if self._old:
                old_pop = self._old.pop
                for key in chunk:
                    old_pop(key, None)
            self._young.update(zip(chunk, values[lo:hi]))
            self._after_write(hi - lo)

    def replace(self, key: K, value: V) -> None:
        """Replace the value of a present key in place, without changing its recency."""
        if key in self._young:
            self._young[key] = value
        else:
            self._old[key] = value

    def pop(self, key: K) -> V | None:
        value = self._young.pop(key, None)
        return self._old.pop(key, None) if value is None else value

    def items(self) -> Iterator[tuple[K, V]]:
        """Snapshot iteration over both generations (old first)."""
        yield from list(self._old.items())
        yield from list(self._young.items())

    def values(self) -> Iterator[V]:
        """Snapshot iteration over the values of both generations."""
        yield from list(self._old.values())
        yield from list(self._young.values())

    def clear(self) -> None:
        self._young, self._old, self._retired = self._new_young(), self._table(), self._table()

    def __len__(self) -> int:
        return len(self._young) + len(self._old)

    def _maybe_rotate(self) -> None:
        if len(self._young) >= self._generation_size:
            if self._old:
                self.evicted += len(self._old)
                self._retired = self._old  # drops a generation still pending, if any
            self._old, self._young = self._young, self._new_young()

    def _new_young(self) -> Table[K, V]:
        """A young generation, which a ``native.U64Map`` sizes for: one holding the generation's
        keys without growing again prepares no doubled array it would not use."""
        table = self._table()
        if self._native:
            cast(NativeTable[K, V], table).plan_for(self._generation_size)
        return table

    def retired_items(self) -> int:
        """Evicted items not yet released (at most one generation)."""
        return len(self._retired)

    def _release_some(self, written: int) -> None:
        budget = _RELEASE_PER_CALL + _RELEASE_PER_KEY * written
        if self._native:  # the same items popitem would release, without a tuple each
            cast(NativeTable[K, V], self._retired).drop_some(budget)
        else:
            popitem = self._retired.popitem
            for _ in range(min(len(self._retired), budget)):
                popitem()
        if not self._retired:
            self._retired = self._table()  # an emptied table keeps its memory: let it go

    def _get_many(self, table: Table[K, V], keys: Sequence[K]) -> list[V | None]:
        """The value of each key, or None (one C call on either table type)."""
        if self._native:
            return cast(NativeTable[K, V], table).get_many(keys)
        return list(map(table.get, keys))

    def _fill(self, table: Table[K, V], keys: Sequence[K], value: V) -> None:
        """Every key set to ``value``."""
        if self._native:
            cast(NativeTable[K, V], table).fill(keys, value)
        else:
            cast(dict[K, V], table).update(dict.fromkeys(keys, value))


def _merged(value: int | None, merge: Callable[[int | None], int]) -> int | None:
    """``merge(value)``, or None when that leaves the mask (and its order) as it was."""
    new = merge(value)
    if value is not None and type(new) is type(value) and new == value:
        return None
    return new
