"""Mixing several training files by weight.

The mix holds as many samples as the files together; a file's weight (over the sum of the
weights) is its share of them, rounded by largest remainder so that the counts add up. A file
asked for more samples than it holds gives each of them the same number of times, the rest a
sample without repetition; one asked for fewer gives a sample without repetition. Every draw
comes from the seed, so the same files, weights and seed give the same mix.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence


def shares(sizes: Sequence[int], weights: Sequence[float]) -> list[int]:
    """How many samples each file gives: sum(sizes) split in proportion to `weights`."""
    total, weight = sum(sizes), sum(weights)
    exact = [total * w / weight for w in weights]
    counts = [math.floor(x) for x in exact]
    by_remainder = sorted(range(len(exact)), key=lambda i: (counts[i] - exact[i], i))
    for i in by_remainder[: total - sum(counts)]:
        counts[i] += 1
    return counts


def draw[T](items: Sequence[T], count: int, rng: random.Random) -> list[T]:
    """`count` of `items`: each whole times over, then a sample of the rest; in file order."""
    whole, rest = divmod(count, len(items))
    picked = sorted([*range(len(items))] * whole + rng.sample(range(len(items)), rest))
    return [items[i] for i in picked]


def mix[T](groups: Sequence[Sequence[T]], weights: Sequence[float], seed: int) -> list[T]:
    """The files' items mixed by weight (module docstring), file after file."""
    rng = random.Random(f"{seed}/mix")
    counts = shares([len(g) for g in groups], weights)
    return [
        item
        for group, count in zip(groups, counts, strict=True)
        for item in draw(group, count, rng)
    ]
