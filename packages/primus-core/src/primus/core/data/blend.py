"""Several prepared corpora blended by weight, in the indexed format's standard blended order
(its reference trainer's, for a blend with weights and a sample count), so that every backend
reading a blend through this module trains on the same sample sequence:

    weights     normalized to sum 1 (float64)
    per corpus  `CorpusSamples` of ceil(ceil(num_samples * w) * 1.005) samples, all with one seed
    size        the sum over corpora of ceil(num_samples * w)
    order       sample j comes from the corpus whose weight * max(j, 1) - samples taken so far
                is largest (the first on a tie): that corpus's next sample
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from primus.core.data.indexed import IndexedCorpus
from primus.core.data.samples import CorpusSamples

SURPLUS = 0.005  # each corpus's samples beyond its share, so that rounding never runs it dry


class BlendedSamples:
    """Samples of `seq_length` + 1 tokens drawn from `corpora` (corpus, weight) in the standard
    blended order: `samples[i]` is training sample i, `len(samples)` how many the blend holds."""

    def __init__(
        self,
        corpora: Sequence[tuple[IndexedCorpus, float]],
        seq_length: int,
        num_samples: int,
        seed: int,
    ) -> None:
        import numpy as np

        raw = np.array([weight for _, weight in corpora], dtype=np.float64)
        weights = (raw / np.sum(raw)).tolist()
        shares = [math.ceil(num_samples * w) for w in weights]
        self.parts = [
            CorpusSamples(corpus, seq_length, math.ceil(share * (1 + SURPLUS)), seed)
            for (corpus, _), share in zip(corpora, shares, strict=True)
        ]
        self.seq_length, self.weights = seq_length, weights
        self.source, self.index = _blending_order(weights, sum(shares))

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, i: int) -> Any:
        """Training sample `i`: seq_length + 1 token ids (int64)."""
        return self.parts[int(self.source[i])][int(self.index[i])]

    def order_settings(self) -> dict[str, Any]:
        """What decides the sample order: the weights and each corpus's order (the blending
        order of the first samples does not depend on how many are drawn)."""
        return {
            "blend": [
                [w, p.order_settings()] for w, p in zip(self.weights, self.parts, strict=True)
            ]
        }

    def describe(self) -> str:
        parts = ", ".join(
            f"{w:.3g} of {p.corpus.bin_path}" for w, p in zip(self.weights, self.parts, strict=True)
        )
        return f"{len(self)} samples of {self.seq_length} + 1 tokens blended from {parts}"


def _blending_order(weights: list[float], size: int) -> tuple[Any, Any]:
    """For each of `size` samples, the corpus it comes from and that corpus's sample number."""
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


def training_samples(
    corpora: Sequence[tuple[str, float | None]], seq_length: int, num_samples: int, seed: int
) -> CorpusSamples | BlendedSamples:
    """The training samples of one corpus ([(PREFIX, any weight)]: no blend), or of several
    (PREFIX, weight) blended."""
    if len(corpora) == 1:
        return CorpusSamples(IndexedCorpus(corpora[0][0]), seq_length, num_samples, seed)
    blend = [(IndexedCorpus(prefix), float(weight or 0.0)) for prefix, weight in corpora]
    return BlendedSamples(blend, seq_length, num_samples, seed)
