"""Data wiring: mock data when the experiment names no dataset; local jsonl/parquet datasets."""

from __future__ import annotations

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
    from primus.backends.torchtitan.data import LOCAL_FORMATS

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
    from primus.backends.torchtitan.data import register_local_datasets

    register_local_datasets()
    path = get_param(ctx, "dataloader.dataset_path")
    if not path:
        raise ConfigError("dataloader.dataset_path: name the local jsonl/parquet file(s) to read")
    log_rank_0(f"[torchtitan] dataset: {get_param(ctx, 'dataloader.dataset')} from {path}")
