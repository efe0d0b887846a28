"""Fine-tuning on Megatron: core's SFT rows as Megatron samples, the forward step, the eval.

Megatron's sampler hands data-parallel rank r micro-batches of the samples
consumed .. consumed + global_batch - 1, so sample i is the row at position i
(`SFTDataset.row`): each rank reads its own rows, and a resumed run (consumed samples restored
from the checkpoint) sees exactly the rows it would have seen.

Packed rows: Megatron's local attention takes a full mask, so each row gets its block-diagonal
causal mask (a position attends to earlier positions of its own sample only). A row carries
only its samples' ids (`segment_ids`); `get_batch` makes the mask on the GPU. Megatron's RoPE
rotates by the position in the row, not `position_ids`; within a block the scores depend only
on the distance between query and key, so this equals positions restarting per sample.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any

import torch

from primus.backends.megatron.providers import get_batch, loss_func
from primus.core.posttrain import REFERENCE_KEY, PairDataset, SFTDataset, token_stats_torch

Rows = SFTDataset | PairDataset  # SFT rows, or DPO's pairs (each tensor with a leading 2)


class SFTSamples(torch.utils.data.Dataset):
    """`length` Megatron samples over `Rows`: training rows by position (over epochs), or
    eval rows in order, padded with empty rows (loss mask 0) to a multiple of `multiple`."""

    def __init__(
        self, rows: Rows, length: int, packed: bool, train: bool, multiple: int = 1
    ) -> None:
        self.rows, self.length, self.packed, self.train = rows, length, packed, train
        self.cycle = math.ceil(len(rows) / multiple) * multiple

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if self.train:
            row = self.rows.row(index)
        elif index % self.cycle < len(self.rows):
            row = self.rows[index % self.cycle]
        else:  # padding up to whole eval batches: nothing in the loss
            row = self.rows[0]
            row = {**row, "loss_mask": row["loss_mask"] * 0}
        sample = {
            key: torch.as_tensor(row[key]).long() for key in ("tokens", "labels", "position_ids")
        }
        sample["loss_mask"] = torch.as_tensor(row["loss_mask"])
        if REFERENCE_KEY in row:  # DPO's precomputed reference log-probabilities
            sample[REFERENCE_KEY] = torch.as_tensor(row[REFERENCE_KEY])
        if self.packed:
            sample["segment_ids"] = torch.as_tensor(row["segment_ids"]).int()
        return sample


def eval_batches(rows: Rows, global_batch: int) -> int:
    """Global batches one pass over the eval rows takes (the last padded)."""
    return math.ceil(len(rows) / global_batch)


def datasets_provider(train: Rows, evaluation: Rows | None, packed: bool, global_batch: int) -> Any:
    """megatron.training's dataset provider over the SFT rows or pairs (no test split)."""

    def provide(num_samples: list[int], vp_stage: int | None = None) -> Any:
        train_samples, eval_samples, _ = num_samples
        valid = None
        if evaluation is not None and eval_samples:
            valid = SFTSamples(evaluation, eval_samples, packed, False, global_batch)
        # one sample past what the run reads: Megatron's sampler refuses to start with every
        # sample consumed, which a finished run run again (resumed at its last step) has
        return SFTSamples(train, train_samples + 1, packed, True), valid, None

    return provide


def eval_loss(
    labels: torch.Tensor | None, loss_mask: torch.Tensor | None, logits: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """Core's token stats of one eval micro-batch: `lm loss` and `token acc` as
    (sum, count) pairs, which Megatron's evaluate adds up over micro-batches and ranks."""
    from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region

    assert labels is not None and loss_mask is not None, "the last pipeline stage has them"
    logits = gather_from_tensor_model_parallel_region(logits)  # the whole vocabulary
    loss_sum, correct, count = token_stats_torch(logits, labels, loss_mask).float()
    report = {
        "lm loss": torch.stack([loss_sum, count]),
        "token acc": torch.stack([correct, count]),
    }
    return loss_sum, count.to(torch.int), report


def forward_step(data_iterator: Any, model: Any) -> tuple[torch.Tensor, Any]:
    """Training: the per-token losses, masked by the rows' loss mask. Eval (the model in eval
    mode): the logits, for loss and token accuracy."""
    batch = get_batch(data_iterator)
    inputs = (batch["tokens"], batch["position_ids"], batch.get("attention_mask"))
    if model.training:
        output = model(*inputs, labels=batch["labels"], loss_mask=batch["loss_mask"])
        return output, partial(loss_func, batch["loss_mask"])
    return model(*inputs), partial(eval_loss, batch["labels"], batch["loss_mask"])
