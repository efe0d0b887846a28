"""Which samples share a row: best-fit decreasing packing, or one sample per row."""

from __future__ import annotations

import bisect
from collections.abc import Sequence


def pack(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Rows of sample indices whose lengths sum to at most `capacity`, each sample (longest
    first) going to the row it fills best. Every length must be <= capacity."""
    rows: list[list[int]] = []
    free: list[tuple[int, int]] = []  # (room left, row), sorted
    for index in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        size = lengths[index]
        slot = bisect.bisect_left(free, (size, -1))
        if slot == len(free):
            rows.append([index])
            bisect.insort(free, (capacity - size, len(rows) - 1))
            continue
        room, row = free.pop(slot)
        rows[row].append(index)
        bisect.insort(free, (room - size, row))
    return rows


def one_per_row(count: int) -> list[list[int]]:
    """Each sample alone in its row (packing off)."""
    return [[i] for i in range(count)]
