"""Rows read by global position in place of MaxText's input pipeline (core's SFT rows, a
prepared corpus's samples).

A MaxText batch holds `inputs`, `inputs_position`, `inputs_segmentation`, `targets`,
`targets_position` and `targets_segmentation` (`maxtext_batch`). MaxText's `loss_fn` sums the
cross-entropy where `targets_segmentation != 0` and divides by the count of those positions
over the global batch; its attention keeps each position within its `inputs_segmentation`
segment and its RoPE rotates by `inputs_position`.

Batches are global: process p of n loads rows p * b / n .. (p + 1) * b / n - 1 of each global
batch of b rows (MaxText's `MultiHostDataLoadIterator` puts them on its devices in that order).
Training step s (counted from 0) reads the rows at positions s * b .. s * b + b - 1, so a run
resumed at step s (MaxText's `get_first_step`) reads what the whole run would have read there.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from primus.core.errors import ConfigError
from primus.core.logging import log_rank_0
from primus.core.patches import PatchContext

TRAIN = "maxtext.trainers.pre_train.train"


def maxtext_batch(rows: dict[str, Any]) -> dict[str, Any]:
    """Stacked core rows (`tokens`, `labels`, `loss_mask`, `position_ids`, `segment_ids`: as
    `SFTDataset.batch` gives them) as a MaxText batch: the inputs' segment and position ids
    are the rows', and `targets_segmentation` is the segment id where `loss_mask` is 1, else 0."""
    import numpy as np

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


def share(global_batch: int, process: int, processes: int) -> tuple[int, int]:
    """(first row, rows) of one process's share of a global batch."""
    local = global_batch // processes
    return process * local, local


def loaded_batch(config: Any, what: str) -> int:
    """The rows of MaxText's global batch (`config`), every loaded row trained on: a
    ConfigError otherwise (`what` needs it)."""
    if config.global_batch_size_to_load != config.global_batch_size_to_train_on:
        raise ConfigError(
            f"maxtext: {what} needs per_device_batch_size >= 1 (every loaded row trained on)"
        )
    return int(config.global_batch_size_to_load)


class GlobalRows:
    """This process's share of every training batch from step `start` on (set once the run's
    first step is known: 0, or the step a resumed run continues from). A subclass gives the
    MaxText batch of `count` rows from global position `first`, and names its rows (`what`)."""

    what = "rows"

    def __init__(self, global_batch: int, process: int, processes: int) -> None:
        self.global_batch = global_batch
        self.offset, self.local = share(global_batch, process, processes)
        self.start: int | None = None

    def batch(self, first: int, count: int) -> dict[str, Any]:
        raise NotImplementedError

    def starting(self, step: int) -> None:
        """Told the step the loop starts from, before the first batch (a subclass may check
        that a resumed run reads what it should)."""

    def __iter__(self) -> Iterator[dict[str, Any]]:
        assert self.start is not None, "the first step is set before the first batch"
        step = self.start
        while True:
            yield self.batch(step * self.global_batch + self.offset, self.local)
            step += 1


class FirstStep:
    """`get_first_step` of MaxText's train loop, wrapped: the step the loop starts from (0,
    or a resumed checkpoint's) is where the rows start."""

    def __init__(self, rows: GlobalRows) -> None:
        self.rows = rows

    def __call__(self, original: Any) -> Any:
        def get_first_step(model: Any, state: Any) -> int:
            step = int(original(model, state))
            self.rows.starting(step)
            self.rows.start = step
            log_rank_0(f"[maxtext] {self.rows.what} from position {step * self.rows.global_batch}")
            return step

        return get_first_step


def feed(ctx: PatchContext, train: GlobalRows, evaluation: Any = None) -> None:
    """MaxText's training loop reads `train` (and evaluates on the batches `evaluation` yields,
    when given) instead of its input pipeline's data, from the step it starts at."""

    def create_data_iterator(config: Any, mesh: Any) -> tuple[Any, Any]:
        from maxtext.input_pipeline.multihost_dataloading import MultiHostDataLoadIterator

        batches = MultiHostDataLoadIterator(train, mesh)
        return batches, MultiHostDataLoadIterator(evaluation, mesh) if evaluation else None

    ctx.replace(
        "maxtext.input_pipeline.input_pipeline_interface",
        "create_data_iterator",
        create_data_iterator,
    )
    ctx.wrap(TRAIN, "get_first_step", FirstStep(train))
