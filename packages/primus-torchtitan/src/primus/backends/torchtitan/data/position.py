"""Resuming with another data-parallel size (TorchTitan asserts that it is unchanged): the saved
read positions of TorchTitan's text dataset are re-sharded, so that the resumed run reads each
row left in the epoch exactly once.

Each data-parallel rank of TorchTitan's `HuggingFaceTextDataset` (map-style data: the local
jsonl/parquet datasets) reads, in each epoch, an ordered list of the dataset's rows (its
contiguous shard, shuffled with seed 42 + epoch from epoch 1 on) and saves how many rows it has
read, and the tokens it has read but not trained on yet (its buffers). A re-shard puts every
old rank's unread rows one after the other, in rank order, and splits them contiguously among
the new ranks; old rank r's buffered tokens go to new rank r mod (new size). Each new rank
saves its list (`ORDER`) with its position until the epoch ends; the next epoch reads the
usual shards.
"""

from __future__ import annotations

import pickle
from typing import Any

from primus.core.errors import ConfigError

ORDER = "primus_order"  # the dataset state's list of rows for this epoch, after a re-shard
BUFFERS = ("inputs_buffer", "labels_buffer", "positions_buffer")


def _block(rows: int, parts: int, index: int) -> range:
    """Part `index` of `parts` contiguous parts of range(rows), as `Dataset.shard` cuts."""
    div, mod = divmod(rows, parts)
    start = div * index + min(index, mod)
    return range(start, start + div + (1 if index < mod else 0))


def shard_order(rows: int, world: int, rank: int, epoch: int) -> list[int]:
    """The rows rank `rank` of `world` reads in `epoch`, in TorchTitan's order."""
    from datasets import Dataset

    ids = list(_block(rows, world, rank))
    if epoch == 0:
        return ids
    return Dataset.from_dict({"i": ids}).shuffle(seed=42 + epoch)["i"]  # the same permutation


def reshard(states: list[dict[str, Any]], rows: int, world: int) -> list[dict[str, Any]]:
    """The dataset states of `world` new ranks from the old ranks' `states`
    (`HuggingFaceTextDataset.state_dict()`s) over a dataset of `rows` rows."""
    epochs = {state["epoch"] for state in states}
    if len(epochs) != 1:
        raise ConfigError(
            f"torchtitan: the data-parallel size changed, and the saved ranks are in different "
            f"epochs of the dataset ({sorted(epochs)}): their positions cannot be re-sharded",
            hint="resume with the data-parallel size of the checkpoint",
        )
    (epoch,) = epochs
    unread = [
        row
        for rank, state in enumerate(states)
        for row in (state.get(ORDER) or shard_order(rows, len(states), rank, epoch))[
            state["sample_idx"] :
        ]
    ]
    new = []
    for rank in range(world):
        mine = [state for old, state in enumerate(states) if old % world == rank]
        buffers = {key: [t for state in mine for t in state.get(key, [])] for key in BUFFERS}
        part = _block(len(unread), world, rank)
        order = unread[part.start : part.stop]
        new.append(buffers | {"sample_idx": 0, "epoch": epoch, ORDER: order})
    return new


class Resharded:
    """Stands for a `ParallelAwareDataloader` in a DCP load whose checkpoint was saved by
    `saved` data-parallel ranks: asks DCP for every saved rank's position, and loads this
    rank's share of them into the loader."""

    def __init__(self, loader: Any, saved: int) -> None:
        self.loader, self.saved = loader, saved

    def state_dict(self) -> dict[str, Any]:
        return {f"dp_rank_{r}": b"" for r in range(self.saved)} | {"world_size": 0}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        from torchtitan.components.dataloader import ParallelAwareDataloader

        loader, rank, world = self.loader, self.loader.dp_rank, self.loader.dp_world_size
        old = [pickle.loads(state[f"dp_rank_{r}"]) for r in range(self.saved)]
        rows = len(loader.dataset._original_data._primus_full)
        mine = reshard([o["dataset_state"] for o in old], rows, world)[rank]
        position = old[rank % self.saved] | {"dataset_state": mine}
        ParallelAwareDataloader.load_state_dict(
            loader, {f"dp_rank_{rank}": pickle.dumps(position), "world_size": world}
        )


def check_reshardable(loader: Any, saved: int) -> None:
    """A ConfigError unless `loader` reads a map-style TorchTitan text dataset in-process."""
    from datasets import Dataset

    from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataset

    dataset = getattr(loader, "dataset", None)
    if (
        isinstance(dataset, HuggingFaceTextDataset)
        and isinstance(dataset._original_data, Dataset)
        and hasattr(dataset._original_data, "_primus_full")
        and loader.num_workers == 0
    ):
        return
    raise ConfigError(
        f"torchtitan: the checkpoint's data position was saved by {saved} data-parallel "
        f"ranks, this run has {loader.dp_world_size}: re-sharding it is supported for "
        "TorchTitan's text datasets read in-process (local jsonl/parquet, dataloader."
        "num_workers 0) only",
        hint="resume with the data-parallel size of the checkpoint",
    )


def saved_ranks(checkpoint: str) -> int:
    """How many data-parallel ranks saved their data position in the DCP `checkpoint`."""
    from torch.distributed.checkpoint import FileSystemReader

    keys = FileSystemReader(checkpoint).read_metadata().state_dict_metadata
    return sum(key.startswith("dataloader.dp_rank_") for key in keys)
