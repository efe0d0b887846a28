"""Data wiring: mock data when the experiment names no dataset; local jsonl/parquet datasets;
the data position re-sharded when a run resumes with another data-parallel size."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from primus.core.errors import ConfigError
from primus.core.logging import log_rank_0
from primus.core.patches import TESTED, PatchContext, get_param, register_patch


def _no_data(ctx: PatchContext) -> bool:
    """no dataloader.dataset given and mock_data not set"""
    return get_param(ctx, "mock_data") is None and not get_param(ctx, "dataloader.dataset")


@register_patch(
    "torchtitan.mock_data",
    backend="torchtitan",
    phase="setup",
    condition=_no_data,
    target="Trainer.Config.dataloader, Trainer.Config.tokenizer",
    tags=("data",),
)
def mock_data(ctx: PatchContext) -> None:
    """Train on a synthetic token stream (no tokenizer, no hub access) when no dataset is given."""
    ctx.set_param("mock_data", True, "no dataloader.dataset given")


def _local_dataset(ctx: PatchContext) -> bool:
    """dataloader.dataset is jsonl or parquet"""
    from primus.backends.torchtitan.data.inputs import LOCAL_FORMATS

    return get_param(ctx, "dataloader.dataset") in LOCAL_FORMATS


@register_patch(
    "torchtitan.local_datasets",
    backend="torchtitan",
    phase="build_args",
    condition=_local_dataset,
    backend_versions=TESTED,
    target="torchtitan.hf_datasets.text_datasets.DATASETS",
    tags=("data",),
)
def local_datasets(ctx: PatchContext) -> None:
    """Add `jsonl` and `parquet` datasets: a local file or glob in dataloader.dataset_path whose
    records have a `text` field, tokenized by the tokenizer in hf_assets_path."""
    from primus.backends.torchtitan.data.datasets import register_local_datasets

    register_local_datasets()
    path = get_param(ctx, "dataloader.dataset_path")
    if not path:
        raise ConfigError("dataloader.dataset_path: name the local jsonl/parquet file(s) to read")
    log_rank_0(f"[torchtitan] dataset: {get_param(ctx, 'dataloader.dataset')} from {path}")


@register_patch(
    "torchtitan.data_reshard",
    backend="torchtitan",
    phase="build_args",
    backend_versions=TESTED,
    target="torchtitan.hf_datasets.text_datasets (split_dataset_by_node, HuggingFaceTextDataset "
    "state), CheckpointManager.dcp_load",
    tags=("data", "reliability"),
)
def data_reshard(ctx: PatchContext) -> None:
    """Resuming with another data-parallel size: instead of TorchTitan's assertion, the text
    dataset's saved positions are re-sharded (primus.backends.torchtitan.data.position), so that
    the resumed run reads each row left in the epoch exactly once; other datasets: a config
    error that says so."""
    from primus.backends.torchtitan.data import position

    text = "torchtitan.hf_datasets.text_datasets"
    dataset = f"{text}.HuggingFaceTextDataset"

    def keep_full(original: Callable[..., Any]) -> Callable[..., Any]:
        def split_dataset_by_node(data: Any, rank: int, world_size: int) -> Any:
            shard = original(data, rank, world_size)
            shard._primus_full = data  # for a re-shard: rows outside this rank's shard
            return shard

        return split_dataset_by_node

    def save_order(original: Callable[..., dict]) -> Callable[..., dict]:
        def state_dict(self: Any) -> dict:
            order = getattr(self, "_primus_order", None)
            return original(self) | ({position.ORDER: order} if order is not None else {})

        return state_dict

    def load_order(original: Callable[..., None]) -> Callable[..., None]:
        def load_state_dict(self: Any, state: dict) -> None:
            original(self, state)
            self._primus_order = state.get(position.ORDER)
            if self._primus_order is not None:
                self._data = self._original_data._primus_full.select(self._primus_order)

        return load_state_dict

    def end_order(original: Callable[..., None]) -> Callable[..., None]:
        def reloop(self: Any) -> None:
            self._primus_order = None  # the next epoch reads the usual shard
            original(self)

        return reloop

    def resharded(original: Callable[..., None]) -> Callable[..., None]:
        def dcp_load(self: Any, state_dict: dict, checkpoint_id: str, **kwargs: Any) -> None:
            loader = state_dict.get("dataloader")
            if loader is not None and not kwargs.get("from_hf"):
                saved = position.saved_ranks(checkpoint_id)
                if saved and saved != loader.dp_world_size:
                    position.check_reshardable(loader, saved)
                    log_rank_0(f"[torchtitan] data position: saved by {saved} data-parallel "
                               f"ranks, resumed on {loader.dp_world_size}: the rows left in "
                               "the epoch and the buffered tokens are re-sharded")  # fmt: skip
                    state_dict = state_dict | {"dataloader": position.Resharded(loader, saved)}
            original(self, state_dict, checkpoint_id, **kwargs)

        return dcp_load

    ctx.wrap(text, "split_dataset_by_node", keep_full)
    ctx.wrap(dataset, "state_dict", save_order)
    ctx.wrap(dataset, "load_state_dict", load_order)
    ctx.wrap(dataset, "reloop", end_order)
    ctx.wrap("torchtitan.components.checkpointer.CheckpointManager", "dcp_load", resharded)
