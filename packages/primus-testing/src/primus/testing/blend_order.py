"""The blended sample order as the plain greedy loop, one Python step per sample: the reference
that core's numpy block simulation (`primus.core.data.blend`) must equal, and its benchmark's
baseline."""

from __future__ import annotations

from typing import Any


def greedy_blend_order(weights: list[float], size: int) -> tuple[Any, Any]:
    """Sample j comes from the corpus with the largest weight * max(j, 1) - samples taken so
    far, the first one on a tie: (corpus of each sample, its sample number in that corpus)."""
    import numpy as np

    source = np.zeros(size, dtype=np.int16)
    index = np.zeros(size, dtype=np.int64)
    taken = [0] * len(weights)
    for j in range(size):
        at = max(float(j), 1.0)
        errors = [w * at - t for w, t in zip(weights, taken, strict=True)]
        pick = errors.index(max(errors))  # the first of equal errors, as a strict > keeps
        source[j], index[j] = pick, taken[pick]
        taken[pick] += 1
    return source, index
