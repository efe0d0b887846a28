"""Fine-tuning on MaxText: core's SFT rows as MaxText batches, and the eval step.

A row's segment ids and position ids (restarting per sample) become the MaxText batch's
inputs', and `targets_segmentation` is the segment id where `loss_mask` is 1, else 0
(`primus.backends.maxtext.data.rows.maxtext_batch`): the loss is core's masked mean over the
global batch, and packed samples never see each other.

Training step s reads the rows at positions s * b .. s * b + b - 1 of a global batch of b,
each process its share (primus.backends.maxtext.data.rows).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np

from primus.backends.maxtext.data.rows import GlobalRows, maxtext_batch, share
from primus.core.posttrain import SFTDataset

ROW_KEYS = ("tokens", "labels", "loss_mask", "position_ids", "segment_ids")  # what a batch needs


class TrainRows(GlobalRows):
    """This process's share of every training batch of SFT rows, from step `start` on."""

    what = "sft rows"

    def __init__(self, rows: SFTDataset, global_batch: int, process: int, processes: int):
        super().__init__(global_batch, process, processes)
        self.rows = rows

    def batch(self, first: int, count: int) -> dict[str, np.ndarray]:
        return maxtext_batch(self.rows.batch(first, count))


class EvalRows:
    """This process's share of each global batch of one pass over the eval rows in order;
    the last batch is filled with rows outside the loss (`targets_segmentation` 0)."""

    def __init__(self, rows: SFTDataset, global_batch: int, process: int, processes: int):
        self.rows, self.global_batch = rows, global_batch
        self.offset, self.local = share(global_batch, process, processes)
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
