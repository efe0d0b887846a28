"""Data wiring: mock data when the experiment names no data."""

from __future__ import annotations

from primus.core.patches import PatchContext, register_patch

DATA_KEYS = (
    "data_path",
    "train_data_path",
    "valid_data_path",
    "test_data_path",
    "data_args_path",
    "per_split_data_args_path",
    "mock_data",
)


def _no_data(ctx: PatchContext) -> bool:
    """pretraining, with no data_path (or other data source) and no mock_data given"""
    none = all(ctx.params.get(key) in (None, False, []) for key in DATA_KEYS)
    return ctx.stage == "pretrain" and none


@register_patch(
    "megatron.mock_data",
    backend="megatron",
    phase="setup",
    condition=_no_data,
    target="megatron args: mock_data, tokenizer_type",
    tags=("data",),
)
def mock_data(ctx: PatchContext) -> None:
    """Train on Megatron's mock GPT dataset (NullTokenizer over vocab_size) when no data is given."""
    ctx.set_param("mock_data", True, "no data_path given (set data_path to train on data)")
    if ctx.params.get("tokenizer_type") is None:
        ctx.set_param("tokenizer_type", "NullTokenizer", "mock data needs no tokenizer")
