"""Core's blended sample order: `_blending_order` (blocks of steps run side by side in numpy,
then replayed where a block's guessed start was wrong) against the plain greedy loop it
replaced, which is Megatron's build_blending_indices, for exact equality on random and
adversarial weights and sizes."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from primus.core.data import blend
from primus.core.data.blend import _blending_order
from primus.testing.blend_order import greedy_blend_order as reference

NAN, INF = float("nan"), float("inf")
ADVERSARIAL = [
    [1.0],
    [0.5, 0.5],
    [1 / 3] * 3,
    [0.25] * 4,
    [0.1] * 10,
    [1 / 7] * 7,
    [0.1, 0.2, 0.7],
    [0.2, 0.3, 0.5],
    [0.7, 0.3],
    [0.6, 0.2, 0.2],
    [0.5, 0.25, 0.125, 0.125],
    [0.05, 0.15, 0.3, 0.5],
    [1e-6, 1 - 1e-6],
    [2**-20, 1 - 2**-20],
    [1e-9, 0.5, 0.5 - 1e-9],
    [1e-3, 0.3, 0.699],
    [1e-6, 1e-5, 0.2, 0.799989],
    [0.0, 1.0],
    [0.0, 0.5, 0.5],
    [1.0, 2.0, 3.0],  # not normalized: the errors drift
    [-1.0, 2.0],
    [0.0, 0.0],
    [-0.0, 0.0],
    [1e-300, 1.0],
    [1e300, 1e300],
    [INF, 1.0],
    [1.0, INF, 1.0],
    [NAN, 1.0],  # NaN first: the reference always picks it
    [1.0, NAN, 2.0],  # NaN later: never picked
]
SIZES = [0, 1, 2, 3, 4, 5, 8, 9, 10, 63, 64, 65, 1000, 4097]


@pytest.fixture
def replays(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Whether each replay of a wrongly guessed block rejoined its first run."""
    seen: list[bool] = []
    replay = blend._replay

    def counted(*args: Any) -> bool:
        seen.append(replay(*args))
        return seen[-1]

    monkeypatch.setattr(blend, "_replay", counted)
    return seen


@pytest.fixture
def reruns(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The first step of each side-by-side run: above 0 when later blocks run again."""
    seen: list[float] = []
    simulate = blend._simulate

    def counted(w: Any, first: Any, *args: Any) -> Any:
        seen.append(float(first[0]))
        return simulate(w, first, *args)

    monkeypatch.setattr(blend, "_simulate", counted)
    return seen


def assert_same(weights: list[float], size: int) -> None:
    source, index = _blending_order(weights, size)
    expected_source, expected_index = reference(weights, size)
    assert (source.dtype, index.dtype) == (np.int16, np.int64)
    assert np.array_equal(source, expected_source), (weights, size)
    assert np.array_equal(index, expected_index), (weights, size)


def test_adversarial_weights_at_block_and_chunk_edges(
    replays: list[bool], reruns: list[float]
) -> None:
    """Ties (equal weights, exact binary fractions), decimal weights, tiny and zero weights,
    weights that are not normalized or not finite, at sizes of one block, of block edges and
    of more than one chunk of steps; among them blocks replayed to their end and later blocks
    run again."""
    for weights in ADVERSARIAL:
        for size in SIZES:
            assert_same(weights, size)
    assert False in replays
    assert max(reruns) > 0


def test_random_weights(replays: list[bool]) -> None:
    """Random blends of 2 to 40 corpora, as BlendedSamples normalizes them (uniform, skewed,
    small integers, one decimal, some tiny), at random sizes; wrong guesses rejoin."""
    rng = np.random.default_rng(20261129)
    for case in range(48):
        k = int(rng.choice([2, 3, 4, 5, 8, 13, 40]))
        raw = [
            rng.random(k),
            rng.random(k) ** 6,
            rng.integers(1, 10, k).astype(float),
            np.round(rng.random(k), 1) + 0.1,
            np.where(rng.random(k) < 0.3, 10.0 ** -rng.integers(3, 8, k), rng.random(k)),
        ][case % 5]
        weights = (raw / np.sum(raw)).tolist()
        assert_same(weights, int(rng.integers(0, 6000)) if case % 8 else 20_000)
    assert True in replays


def test_no_corpora() -> None:
    assert [len(a) for a in _blending_order([], 0)] == [0, 0]
    with pytest.raises(ValueError):
        _blending_order([], 1)
