"""Fine-tuning on TorchTitan: core's SFT rows through a TorchTitan dataloader, and the eval.

Rows: each step reads the global batch at positions step * G .. step * G + G - 1 (G the global
batch); data-parallel rank r reads its slice r * L .. r * L + L - 1 of it (L = G / dp, its
micro-batches of the step in order). The dataloader's state is the rows this rank has read, in
TorchTitan's checkpoint, so a resumed run reads exactly the rows it would have read.

Targets outside `loss_mask` become TorchTitan's ignore index: its loss is the sum over the valid
targets divided by the global batch's count of them (`global_valid_tokens`), core's masked mean.
`positions` restart at each sample, which TorchTitan's flex/varlen attention turns into a
document mask (no attention across packed samples) and RoPE uses as each token's position.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated, Any

import torch
import tyro

from primus.backends.torchtitan.data.corpus import Batch, GlobalRows
from primus.core.errors import ConfigError
from primus.core.posttrain import (
    REFERENCE_KEY,
    PairDataset,
    SFTDataset,
    TokenStats,
    dpo_eval_metrics,
    token_stats_torch,
)
from torchtitan.components.dataloader import ParallelAwareDataloader
from torchtitan.components.loss import IGNORE_INDEX
from torchtitan.components.validate import BaseValidator, Validator

VALIDATION = "validation_metrics/"  # log_validation's prefix, and of its extra metrics
ACCURACY = f"{VALIDATION}token_accuracy"


def titan_row(row: dict[str, Any]) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """A core row as TorchTitan's (inputs, labels): labels outside the loss mask ignored."""
    labels = torch.as_tensor(row["labels"]).long()
    labels[torch.as_tensor(row["loss_mask"]) == 0] = IGNORE_INDEX
    inputs = {
        "input": torch.as_tensor(row["tokens"]).long(),
        "positions": torch.as_tensor(row["position_ids"]).long(),
    }
    if REFERENCE_KEY in row:  # DPO's precomputed reference log-probabilities
        inputs[REFERENCE_KEY] = torch.as_tensor(row[REFERENCE_KEY])
    return inputs, labels


class SFTRows(GlobalRows):
    """This data-parallel rank's training rows, endless (epochs follow each other)."""

    def __init__(self, rows: SFTDataset, global_batch: int, dp_rank: int, dp_size: int) -> None:
        super().__init__(global_batch, dp_rank, dp_size)
        self.rows = rows

    def item(self, position: int) -> Batch:
        return titan_row(self.rows.row(position))


class SFTDataLoader(ParallelAwareDataloader):
    """TorchTitan's parallel-aware dataloader over the module's SFT training rows."""

    @dataclass(kw_only=True, slots=True)
    class Config(ParallelAwareDataloader.Config):
        dataset: str = "sft"
        # not from the CLI: the module's sft:, peft: and dpo: (convert_config), its rows (the
        # trainer: SFT rows, or DPO's pairs)
        _sft: Annotated[Any, tyro.conf.Suppress] = None
        _peft: Annotated[Any, tyro.conf.Suppress] = None
        _dpo: Annotated[Any, tyro.conf.Suppress] = None
        _rows: Annotated[Any, tyro.conf.Suppress] = None
        _global_batch: Annotated[int, tyro.conf.Suppress] = -1  # training.global_batch_size

    def __init__(
        self,
        config: Config,
        *,
        dp_world_size: int,
        dp_rank: int,
        local_batch_size: int,
        **_: Any,
    ) -> None:
        if config._rows is None:
            raise ConfigError("torchtitan: the module's sft: section is trained on by "
                              "primus train posttrain")  # fmt: skip
        global_batch = config._global_batch
        if global_batch <= 0:  # TorchTitan's -1: no gradient accumulation
            global_batch = local_batch_size * dp_world_size
        rows = SFTRows(config._rows, global_batch, dp_rank, dp_world_size)
        pairs = {"collate_fn": collate_pairs} if config._dpo is not None else {}
        super().__init__(
            rows, dp_rank=dp_rank, dp_world_size=dp_world_size, batch_size=local_batch_size,
            **pairs,
        )  # fmt: skip


def collate_pairs(pairs: list[Batch]) -> Batch:
    """DPO's pairs (each (2, seq): chosen, rejected) as one batch of rows (2 * pairs, seq):
    row 2i is pair i's chosen side, row 2i + 1 its rejected side."""
    inputs = {k: torch.cat([i[k] for i, _ in pairs]) for k in pairs[0][0]}
    return inputs, torch.cat([labels for _, labels in pairs])


def logits(model: Any, tokens: torch.Tensor, **kwargs: Any) -> torch.Tensor:
    """The model's full logits for `tokens` (`kwargs`: positions, attention masks, as
    TorchTitan's trainer passes them)."""
    from torch.distributed.tensor import DTensor

    output = model(tokens, **kwargs)
    if getattr(model, "_skip_lm_head", False):  # the chunked loss applies lm_head itself
        output = model.lm_head(output)
    return output.full_tensor() if isinstance(output, DTensor) else output


def rank_batches(
    rows: SFTDataset | PairDataset, size: int, dp_size: int, dp_rank: int
) -> Iterator[tuple[int, Batch]]:
    """Data-parallel rank `dp_rank`'s batches of `size` rows of `rows` in order, with the index
    of each batch's first row: every rank the same number (a forward of a sharded model needs
    every rank), the last ones padded with rows outside the loss. A batch of pairs is two rows
    a pair (`collate_pairs`)."""
    total = len(rows)
    for b in range(math.ceil(total / (size * dp_size))):
        start = (b * dp_size + dp_rank) * size
        items = []
        for index in range(start, start + size):
            row = rows[index % total]
            if index >= total:
                row = {**row, "loss_mask": row["loss_mask"] * 0}
            items.append(titan_row(row))
        if isinstance(rows, PairDataset):
            yield start, collate_pairs(items)
            continue
        inputs = {k: torch.stack([i[k] for i, _ in items]) for k in items[0][0]}
        yield start, (inputs, torch.stack([labels for _, labels in items]))


def model_kwargs(model: Any, inputs: dict[str, torch.Tensor]) -> dict[str, Any]:
    """The forward's keyword arguments for a batch's `inputs` (on the model's device), as the
    validator passes them: positions, their attention masks, and DPO's precomputed reference
    log-probabilities where the rows carry them (the DPO step takes those out)."""
    positions = inputs["positions"]
    kwargs = {
        "positions": positions,
        "attention_masks": model.get_attention_masks(positions=positions),
    }
    if REFERENCE_KEY in inputs:
        kwargs[REFERENCE_KEY] = inputs[REFERENCE_KEY]
    return kwargs


class SFTValidator(BaseValidator):
    """One pass over the eval rows: core's token stats, summed over data-parallel ranks, logged
    through TorchTitan's `log_validation` (loss; token accuracy as an extra metric). With
    `dpo` (posttrain.dpo.DPOStep, set by the trainer), over the eval pairs: DPO's eval sums
    against its reference, logged as the loss and the reward metrics (extra metrics)."""

    @dataclass(kw_only=True, slots=True)
    class Config(Validator.Config):  # its type, for TorchTitan's CLI; one pass: `steps` unused
        _rows: Annotated[Any, tyro.conf.Suppress] = None

    dpo: Any = None

    def __init__(
        self,
        config: Config,
        *,
        dp_world_size: int,
        dp_rank: int,
        parallel_dims: Any,
        metrics_processor: Any,
        local_batch_size: int,
        validation_context: Any,
        **_: Any,
    ) -> None:
        super().__init__(config=config)
        self.rows: SFTDataset | PairDataset = config._rows
        self.dp_size, self.dp_rank, self.dims = dp_world_size, dp_rank, parallel_dims
        self.metrics_processor, self.context = metrics_processor, validation_context
        self.batch = local_batch_size

    def batches(self) -> Iterator[Batch]:
        """This rank's eval batches (`rank_batches`)."""
        for _, batch in rank_batches(self.rows, self.batch, self.dp_size, self.dp_rank):
            yield batch

    def batch_sums(self, model: Any, tokens: Any, labels: Any, kwargs: Any) -> torch.Tensor:
        """One batch's sums: core's token stats, or DPO's eval sums."""
        if self.dpo is not None:
            return self.dpo.eval_sums(tokens, labels, kwargs)
        out = logits(model, tokens, **kwargs)
        return token_stats_torch(out, labels.clamp(min=0), labels != IGNORE_INDEX)

    @torch.no_grad()
    def sums(self, model: Any) -> list[float]:
        """The batches' sums, added up over the data-parallel ranks."""
        from torchtitan.tools import utils

        device = utils.device_type
        parts = []
        for inputs, labels in self.batches():
            inputs = {k: v.to(device) for k, v in inputs.items()}
            kwargs = model_kwargs(model, inputs)
            with self.context():
                parts.append(self.batch_sums(model, inputs["input"], labels.to(device), kwargs))
        total = torch.stack(parts).sum(0)
        if self.dims.dp_enabled:
            torch.distributed.all_reduce(total, group=self.dims.get_mesh("batch").get_group())
        return total.tolist()

    def validate(self, model_parts: list[Any], step: int) -> None:
        (model,) = model_parts
        model.eval()
        sums = self.sums(model)
        model.train()
        if self.dpo is None:
            stats = TokenStats(*sums)
            loss, extra = stats.loss, {ACCURACY: stats.accuracy}
        else:
            metrics = dpo_eval_metrics(sums)
            loss = metrics.pop("eval_loss")
            extra = {VALIDATION + k.removeprefix("eval_"): v for k, v in metrics.items()}
        self.metrics_processor.log_validation(loss=loss, step=step, extra_metrics=extra)
