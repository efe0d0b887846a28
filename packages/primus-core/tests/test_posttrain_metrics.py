"""The masked loss and token accuracy every backend reports: numpy and torch agree with the
definition, only masked positions count, and the sums add up across batches."""

from __future__ import annotations

import math

import numpy as np
import pytest

from primus.core.metrics import StepMetrics
from primus.core.posttrain import TokenStats, masked_mean, token_stats, token_stats_torch


@pytest.fixture(scope="module")
def batch() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 5, 7)).astype(np.float32)
    labels = rng.integers(0, 7, size=(3, 5))
    labels[0, :3] = logits[0, :3].argmax(-1)  # some right, some wrong
    mask = (rng.random((3, 5)) < 0.6).astype(np.float32)
    mask[0, :3] = 1
    return logits, labels, mask


def by_hand(logits, labels, mask) -> tuple[float, float, float]:
    loss = correct = count = 0.0
    for i, j in zip(*np.nonzero(mask), strict=True):
        row = logits[i, j].astype(np.float64)
        loss += math.log(np.exp(row).sum()) - row[labels[i, j]]
        correct += float(row.argmax() == labels[i, j])
        count += 1
    return loss, correct, count


def test_numpy_and_torch_match_the_definition(batch) -> None:
    import torch

    expected = by_hand(*batch)
    stats = token_stats(*batch)
    assert (stats.loss_sum, stats.correct, stats.count) == pytest.approx(expected, rel=1e-5)
    assert 0 < stats.correct < stats.count
    sums = token_stats_torch(*(torch.from_numpy(a) for a in batch)).tolist()
    assert sums == pytest.approx(expected, rel=1e-5)
    assert TokenStats(*sums).as_metrics() == {
        "eval_loss": pytest.approx(expected[0] / expected[2], rel=1e-5),
        "eval_token_accuracy": expected[1] / expected[2],
    }


def test_unmasked_positions_do_not_count_and_sums_add(batch) -> None:
    logits, labels, mask = batch
    noisy = logits.copy()
    noisy[mask == 0] = 100.0
    assert token_stats(noisy, labels, mask) == token_stats(logits, labels, mask)
    halves = token_stats(logits[:1], labels[:1], mask[:1]) + token_stats(
        logits[1:], labels[1:], mask[1:]
    )
    whole = token_stats(logits, labels, mask)
    assert halves.loss == pytest.approx(whole.loss) and halves.accuracy == whole.accuracy
    per_token = np.arange(15, dtype=np.float32).reshape(3, 5)
    assert masked_mean(per_token, mask) == pytest.approx((per_token * mask).sum() / mask.sum())
    assert math.isnan(TokenStats().loss)


def test_the_step_line_shows_eval_beside_the_train_loss() -> None:
    metrics = StepMetrics(10, 20, 1.5, 0.1, 1000.0, 1.0, None, eval_loss=1.25,
                          eval_token_accuracy=0.975)  # fmt: skip
    assert "loss 1.5000 | eval loss 1.2500 | eval token acc 97.50% |" in metrics.line()
    assert metrics.scalars()["primus/eval_token_accuracy"] == 0.975
    assert "eval" not in StepMetrics(1, 2, 1.0, 0.1, 1.0, 1.0, None).line()
    dpo = StepMetrics(10, 20, 0.5, 0.1, 1000.0, 1.0, None, eval_loss=0.6, eval_reward_margin=0.25,
                      eval_reward_accuracy=0.75, reward_margin=0.5)  # fmt: skip
    assert "eval loss 0.6000 | eval reward margin 0.2500 | eval reward acc 75.00% |" in dpo.line()
    assert dpo.scalars()["primus/eval_reward_accuracy"] == 0.75
