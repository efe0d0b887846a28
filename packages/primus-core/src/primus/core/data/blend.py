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
RERUNS = 4  # runs again of the later blocks, each after a rare corpus's pick
CHUNK = 64  # steps of all blocks gathered before they are written into the blocks' rows


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
    """For each of `size` samples, the corpus it comes from and that corpus's sample number: the
    greedy order of the module docstring, bit for bit.

    The greedy is sequential, so its steps are cut into blocks of about sqrt(size) steps that
    numpy runs side by side (`_simulate`), each from a guess of the counts taken before it
    (`_guess`), in the reference's float64 arithmetic and first-maximum rule. Then, in order: a
    block whose guess equals the exact counts (the previous block's end; zeros for block 0) is
    exact, and a block whose guess was wrong is replayed with the reference loop from the exact
    counts until its counts equal its first run's at the same step (`_replay`): the rest of the
    run is exact, the path being a function of the step and the counts.

    A wrong guess mostly rejoins within a few steps; not while it miscounts a corpus of tiny
    weight, picked at irregular steps. When a corpus picked fewer than RERUNS times in all is
    miscounted at a block's end, the later blocks are guessed again with its count and run
    again. Corpora a little less rare can still leave many blocks to replay: at worst the cost
    is about the reference loop's plus a few numpy runs.
    """
    import numpy as np

    if not size:
        return np.zeros(0, dtype=np.int16), np.zeros(0, dtype=np.int64)
    if not weights:
        raise ValueError("no corpora to blend")
    k, width = len(weights), max(1, math.isqrt(size))
    blocks = -(-size // width)
    w = np.array(weights, dtype=np.float64).reshape(k, 1)
    nan = np.isnan(w[:, 0])
    w[nan] = -np.inf  # a NaN error is never the reference's max() after a number ...
    if nan[0]:
        w[0] = np.inf  # ... and always the max when it comes first
    first = np.arange(blocks, dtype=np.float64) * width
    with np.errstate(all="ignore"):  # weights that are not finite: no corpus is rare
        rare = w[:, 0] / w.sum() * size < RERUNS  # picked fewer times than there are reruns
    shift = np.zeros((k, 1))
    start = _guess(w, first, shift)
    source = np.empty((blocks, width), dtype=np.int16)
    index = np.empty((blocks, width), dtype=np.int64)
    end = _simulate(w, first, start, source, index)
    starts, ends = start.T.tolist(), end.T.tolist()
    b, taken, reruns = 0, [0.0] * k, RERUNS
    while b < blocks:
        rejoined = starts[b] == taken or _replay(
            weights, b * width, taken, starts[b], source[b], index[b]
        )
        if rejoined:
            taken = ends[b]
        b += 1  # else replayed to the block's end: `taken` is the exact end
        if rejoined or not reruns or b == blocks:
            continue
        missed = (np.array(taken) - start[:, b]) * rare
        if missed.any():  # a rare corpus's count, which every later guess misses too
            reruns -= 1
            shift[:, 0] += missed
            start[:, b:] = _guess(w, first[b:], shift)
            end[:, b:] = _simulate(w, first[b:], start[:, b:], source[b:], index[b:])
            starts[b:], ends[b:] = start[:, b:].T.tolist(), end[:, b:].T.tolist()
    return source.reshape(-1)[:size], index.reshape(-1)[:size]


def _guess(w: Any, first: Any, shift: Any) -> Any:
    """A guess of the counts taken before the steps `first` (k x len(first), float64): the
    largest-remainder rounding of the shares w * (step - 1) plus `shift`
    (k x 1: the rare corpora's counts learnt). Shifting each share by its weight centres the
    rounding near where the greedy keeps its errors: right for most blocks of the blends
    measured, where rounding w * step was right for fewer."""
    import numpy as np

    with np.errstate(all="ignore"):  # weights that are not finite: any guess will do
        quota = w / w.sum() * (first - 1) + shift
        taken = np.floor(quota)
        rank = np.argsort(np.argsort(taken - quota, axis=0, kind="stable"), axis=0)
        taken += rank < first - taken.sum(axis=0)
    return np.where(np.isfinite(taken), taken, 0.0)


def _simulate(w: Any, first: Any, start: Any, source: Any, index: Any) -> Any:
    """All blocks side by side, each from the counts `start` (k x blocks) before its first step
    `first`: the picks into the rows of `source`, the sample numbers into those of `index`.
    Returns the counts after each block."""
    import numpy as np

    (k, m), width = start.shape, source.shape[1]
    taken = start.copy()
    flat, cells = taken.reshape(-1), np.arange(m)
    errors, at, where = np.empty((k, m)), np.empty(m), np.empty(m, dtype=np.intp)
    picks, counts = np.empty((CHUNK, m), dtype=np.int16), np.empty((CHUNK, m))
    for s in range(width):
        np.add(first, s, out=at)
        if s == 0:
            np.maximum(at, 1.0, out=at)  # the reference's max(j, 1)
        np.multiply(w, at, out=errors)
        errors -= taken  # w * at - taken, rounded as the reference rounds it
        for i in range(1, k):  # the running maximum over the corpora
            np.maximum(errors[i - 1], errors[i], out=errors[i])
        pick = np.add.reduce(errors[:-1] < errors[-1], axis=0, dtype=np.intp)  # the first max
        c = s % CHUNK
        picks[c] = pick
        np.multiply(pick, m, out=where)
        where += cells
        np.take(flat, where, out=counts[c])
        flat[where] = counts[c] + 1
        if c == CHUNK - 1 or s == width - 1:  # a chunk of steps into the rows' columns
            source[:, s - c : s + 1] = picks[: c + 1].T
            index[:, s - c : s + 1] = counts[: c + 1].T
    return taken


def _replay(
    weights: list[float], j: int, taken: list[float], guess: list[float], source: Any, index: Any
) -> bool:
    """The reference loop over one block from step `j` and the exact counts `taken` (updated in
    place), correcting the block's first run (`source`, `index`, from the counts `guess`) until
    both have taken the same counts. Returns whether they did before the block's end."""
    ahead = [t - g for t, g in zip(taken, guess, strict=True)]  # the exact counts - the run's
    for s in range(len(source)):
        at = max(float(j + s), 1.0)
        errors = [w * at - t for w, t in zip(weights, taken, strict=True)]
        pick = errors.index(max(errors))  # the first of equal errors, as a strict > keeps
        ran = int(source[s])
        if pick != ran:
            ahead[pick] += 1
            ahead[ran] -= 1
            source[s] = pick
        index[s] = taken[pick]
        taken[pick] += 1
        if not any(ahead):
            return True
    return False


def training_samples(
    corpora: Sequence[tuple[str, float | None]], seq_length: int, num_samples: int, seed: int
) -> CorpusSamples | BlendedSamples:
    """The training samples of one corpus ([(PREFIX, any weight)]: no blend), or of several
    (PREFIX, weight) blended."""
    if len(corpora) == 1:
        return CorpusSamples(IndexedCorpus(corpora[0][0]), seq_length, num_samples, seed)
    blend = [(IndexedCorpus(prefix), float(weight or 0.0)) for prefix, weight in corpora]
    return BlendedSamples(blend, seq_length, num_samples, seed)
