"""Fine-tuning on MaxText: core's SFT rows as MaxText batches, and the eval step.

A MaxText batch holds `inputs`, `inputs_position`, `inputs_segmentation`, `targets`,
`targets_position` and `targets_segmentation`. MaxText's `loss_fn` sums the cross-entropy where
`targets_segmentation != 0` and divides by the count of those positions over the global batch;
its attention keeps each position within its `inputs_segmentation` segment and its RoPE rotates
by `inputs_position`. So a row's segment ids and position ids (restarting per sample) become
the inputs', and `targets_segmentation` is the segment id where `loss_mask` is 1, else 0: the
loss is core's masked mean over the global batch, and packed samples never see each other.

Batches are global: process p of n loads rows p * b / n .. (p + 1) * b / n - 1 of each global
batch of b rows (MaxText's `MultiHostDataLoadIterator` puts them on its devices in that order).
Training step s (counted from 0) reads the rows at positions s * b .. s * b + b - 1.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np

from primus.core.posttrain import SFTDataset

ROW_KEYS = ("tokens", "labels", "loss_mask", "position_ids", "segment_ids")  # what a batch needs


def maxtext_batch(rows: dict[str, Any]) -> dict[str, np.ndarray]:
    """Stacked core rows (`SFTDataset.batch`, or rows stacked alike) as a MaxText batch."""
    segments = np.asarray(rows["segment_ids"], np.int32)
    positions = np.asarray(rows["position_ids"], np.int32)
    return {
        "inputs": np.asarray(rows["tokens"], np.int32),
        "inputs_position": positions,
        "inputs_segmentation": segments,
        "targets": np.asarray(rows["labels"], np.int32),
        "targets_position": positions,
        "targets_segmentation": np.where(np.asarray(rows["loss_mask"]) > 0, segments, 0),
    }


def _share(global_batch: int, process: int, processes: int) -> tuple[int, int]:
    """(first row, rows) of one process's share of a global batch."""
    local = global_batch // processes
    return process * local, local


class TrainRows:
    """This process's share of every training batch from step `start` on (set once the
    run's first step is known: 0, or the step a resumed run continues from)."""

    def __init__(self, rows: SFTDataset, global_batch: int, process: int, processes: int):
        self.rows, self.global_batch = rows, global_batch
        self.offset, self.local = _share(global_batch, process, processes)
        self.start: int | None = None

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        assert self.start is not None, "the first step is set before the first batch"
        step = self.start
        while True:
            yield maxtext_batch(self.rows.batch(step * self.global_batch + self.offset, self.local))
            step += 1


class EvalRows:
    """This process's share of each global batch of one pass over the eval rows in order;
    the last batch is filled with rows outside the loss (`targets_segmentation` 0)."""

    def __init__(self, rows: SFTDataset, global_batch: int, process: int, processes: int):
        self.rows, self.global_batch = rows, global_batch
        self.offset, self.local = _share(global_batch, process, processes)
        self.batches = math.ceil(len(rows) / global_batch)

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        for batch in range(self.batches):
            first = batch * self.global_batch + self.offset
            rows = [self._row(i) for i in range(first, first + self.local)]
            yield maxtext_batch({key: np.stack([r[key] for r in rows]) for key in ROW_KEYS})

    def _row(self, index: int) -> dict[str, np.ndarray]:
        if index < len(self.rows):
            return self.rows[index]
        return {**self.rows[0], "loss_mask": np.zeros_like(self.rows[0]["loss_mask"])}


def eval_step(model: Any, config: Any, state: Any, data: dict[str, Any], dropout_rng: Any = None):
    """MaxText's eval step, computing core's token sums (`token_sums`) from the logits: the
    cross-entropy sum as `evaluation/total_loss` and the count as `evaluation/total_weights`
    (what MaxText's metric logger adds up over the eval batches), and the correct argmax
    predictions as `evaluation/primus_correct`."""
    import jax.numpy as jnp
    from flax import nnx

    from primus.core.posttrain import token_sums

    del dropout_rng
    state = nnx.merge(model, state)
    logits = state.model(
        decoder_input_tokens=data["inputs"],
        decoder_positions=data["inputs_position"],
        decoder_segment_ids=data["inputs_segmentation"],
        enable_dropout=False,
        decoder_target_tokens=data["targets"],
        decoder_target_mask=data["targets_segmentation"],
    )
    nnx.pop(state.model, nnx.Intermediate)
    mask = data["targets_segmentation"] != 0
    loss_sum, correct, count = token_sums(logits, data["targets"], mask, jnp)
    return {
        "scalar": {
            "evaluation/loss": loss_sum / jnp.maximum(count, 1.0),
            "evaluation/total_loss": loss_sum,
            "evaluation/total_weights": count,
            "evaluation/primus_correct": correct,
        }
    }
