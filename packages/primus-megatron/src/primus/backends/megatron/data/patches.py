"""Data wiring: mock data when the experiment names no data; NullTokenizer for prepared corpora
named without a tokenizer (their manifests give its end-of-document id)."""

from __future__ import annotations

from primus.backends.megatron.data.inputs import corpus_tokenizer
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


def _corpus_without_tokenizer(ctx: PatchContext) -> bool:
    """pretraining on prepared corpora, each with its manifest, and no tokenizer_type given"""
    return ctx.stage == "pretrain" and corpus_tokenizer(ctx.params) is not None


@register_patch(
    "megatron.corpus_tokenizer",
    backend="megatron",
    phase="setup",
    condition=_corpus_without_tokenizer,
    target="megatron args: tokenizer_type, null_tokenizer_eod_id",
    tags=("data",),
)
def corpus_tokenizer_args(ctx: PatchContext) -> None:
    """The corpus is tokenized already: NullTokenizer over the model's vocab_size, with the
    end-of-document id of the corpus's manifest (primus data prepare's PREFIX.json)."""
    for key, value in (corpus_tokenizer(ctx.params) or {}).items():
        ctx.set_param(key, value, "data_path's corpus is tokenized already (its manifest)")
