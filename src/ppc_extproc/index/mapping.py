"""llm-d's proportional engine-key → request-key mapping (``engineToRequestMapping``)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TypeVar

__all__ = ["engine_to_request_mapping"]

E = TypeVar("E")
R = TypeVar("R")


def engine_to_request_mapping(
    engine_keys: Sequence[E], request_keys: Sequence[R]
) -> Iterator[tuple[E, tuple[R, ...]]]:
    """Yield ``(engine_key, request_keys)`` pairs: with ``n = max(len(E), len(R))``, index ``i``
    pairs ``E[i*len(E)//n]`` with ``R[i*len(R)//n]``. 1:1, many:1 and 1:many all fall out."""
    n_e, n_r = len(engine_keys), len(request_keys)
    if n_e == 0 or n_r == 0:
        return
    if n_e == n_r:
        for e, r in zip(engine_keys, request_keys):
            yield e, (r,)
        return
    n = max(n_e, n_r)
    current_e = -1
    last_r = -1
    mapped: list[R] = []
    for i in range(n):
        e_index, r_index = i * n_e // n, i * n_r // n
        if e_index != current_e:
            if mapped:
                yield engine_keys[current_e], tuple(mapped)
            current_e, mapped, last_r = e_index, [], -1
        if r_index != last_r:
            mapped.append(request_keys[r_index])
            last_r = r_index
    if mapped:
        yield engine_keys[current_e], tuple(mapped)
