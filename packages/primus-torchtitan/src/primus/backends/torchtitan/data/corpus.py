"""Pretraining on a prepared corpus (`primus data prepare`): `dataloader.dataset: indexed` with
`dataloader.dataset_path: PREFIX` reads PREFIX.bin/.idx through core's `CorpusSamples` (and
`dataloader.blend` several through `BlendedSamples`), so TorchTitan trains on the samples
Megatron draws from the same corpus (or blend) with the same seed,
sequence length and global batch: step s reads samples s * G .. s * G + G - 1 (G the global
batch), data-parallel rank r its slice r * L .. r * L + L - 1 of them (L = G / dp, its
micro-batches in order). Every target is in the loss and positions run 0 .. seq_len - 1 per
row, as Megatron's defaults have them. The rows read are the dataloader's state, in the
checkpoint: a resumed run reads exactly the samples it would have read.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated, Any

import torch
import tyro
from torch.utils.data import IterableDataset

from primus.backends.torchtitan.data.inputs import INDEXED
from torchtitan.components.dataloader import ParallelAwareDataloader

Batch = tuple[dict[str, torch.Tensor], torch.Tensor]


class GlobalRows(IterableDataset):
    """A data-parallel rank's rows of a sequence read by global position, endless: each step's
    `global_batch` rows split into contiguous slices, one per rank (a rank's micro-batches of
    the step in order). The rows read are its state. Subclasses give the row at a position."""

    def __init__(self, global_batch: int, dp_rank: int, dp_size: int) -> None:
        self.global_batch = global_batch
        self.share = global_batch // dp_size
        self.first = dp_rank * self.share
        self.read = 0  # rows this rank has read

    def position(self, k: int) -> int:
        """The global position of this rank's k-th row."""
        return (k // self.share) * self.global_batch + self.first + k % self.share

    def item(self, position: int) -> Batch:
        raise NotImplementedError

    def __iter__(self) -> Iterator[Batch]:
        while True:
            at = self.position(self.read)
            self.read += 1
            yield self.item(at)

    def state_dict(self) -> dict[str, Any]:
        return {"read": self.read}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.read = state["read"]


class CorpusRows(GlobalRows):
    """This data-parallel rank's training samples, as TorchTitan's (inputs, labels)."""

    def __init__(self, samples: Any, global_batch: int, dp_rank: int, dp_size: int) -> None:
        super().__init__(global_batch, dp_rank, dp_size)
        self.samples = samples
        self.positions = torch.arange(samples.seq_length)

    def item(self, position: int) -> Batch:
        tokens = torch.from_numpy(self.samples[position % len(self.samples)])
        return {"input": tokens[:-1], "positions": self.positions}, tokens[1:]

    def state_dict(self) -> dict[str, Any]:
        return super().state_dict() | {"order": self.samples.order_settings()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The rows read, once the checkpoint's sample order is this run's."""
        from primus.core.data.order import check_resumed_order

        keys = "training.steps, training.global_batch_size"
        check_resumed_order(state.get("order"), self.samples.order_settings(), keys)
        super().load_state_dict(state)


class CorpusDataLoader(ParallelAwareDataloader):
    """TorchTitan's parallel-aware dataloader over a prepared corpus's samples."""

    @dataclass(kw_only=True, slots=True)
    class Config(ParallelAwareDataloader.Config):
        dataset: str = INDEXED
        seed: int = 1234
        """The seed of the documents' and samples' order (Megatron's `seed`)."""
        # prepared corpora blended by weight, instead of dataset_path (dataloader.blend)
        blend: Annotated[list[dict[str, Any]] | None, tyro.conf.Suppress] = None
        # not from the CLI: set by the trainer from training.steps and global_batch_size
        _steps: Annotated[int, tyro.conf.Suppress] = 0
        _global_batch: Annotated[int, tyro.conf.Suppress] = -1

    def __init__(
        self,
        config: Config,
        *,
        dp_world_size: int,
        dp_rank: int,
        seq_len: int,
        local_batch_size: int,
        **_: Any,
    ) -> None:
        from primus.core.data.blend import training_samples
        from primus.core.logging import log_rank_0

        global_batch = config._global_batch
        if global_batch <= 0:  # TorchTitan's -1: no gradient accumulation
            global_batch = local_batch_size * dp_world_size
        blend = config.blend or [{"path": config.dataset_path, "weight": None}]
        corpora = [(str(c["path"]), c["weight"]) for c in blend]
        samples = training_samples(corpora, seq_len, config._steps * global_batch, config.seed)
        log_rank_0(f"[torchtitan] data: {samples.describe()}")
        rows = CorpusRows(samples, global_batch, dp_rank, dp_world_size)
        super().__init__(
            rows, dp_rank=dp_rank, dp_world_size=dp_world_size, batch_size=local_batch_size
        )
