"""Attention's 1/sqrt(head_dim) on the queries at run time, as transformers, Megatron-LM and
TorchTitan apply it, for a model that starts from Primus's HF import.

MaxText's Llama and Mixtral fold that scale into the query projection's weights: its HF
conversion scales them and its initializer divides them. The model computes the same, but
Adam's step does not scale with the weights, so folded queries train sqrt(head_dim) times
faster and the loss curve leaves the HF model's. Primus's import keeps the weights as HF has
them and says so in the import folder (checkpoint/query_record.py); a model loading that
import scales its queries at run time (MaxText's own `query_pre_attn_scalar`). An import made
without the record, a `load_parameters_path` of the user's and a model trained from scratch
keep MaxText's folding.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from primus.backends.maxtext.checkpoint.query_record import scaled_at_run_time
from primus.backends.maxtext.maxtext_adapter import TESTED
from primus.core.patches import PatchContext, get_param, register_patch

FOLDED_BLOCKS = {"llama2": "maxtext.models.llama2", "mixtral": "maxtext.models.mixtral"}


def _with_run_time_scale(attention: Any) -> Callable[..., Any]:
    def build(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("query_pre_attn_scalar") is None and scaled_at_run_time(kwargs["config"]):
            kwargs["query_pre_attn_scalar"] = kwargs["head_dim"] ** -0.5
        return attention(*args, **kwargs)

    return build


def _folding_block(ctx: PatchContext) -> bool:
    """decoder_block is llama2 or mixtral (the blocks that fold the query scale)"""
    return str(get_param(ctx, "decoder_block", "")).lower() in FOLDED_BLOCKS


@register_patch(
    "maxtext.query_scale_at_run_time",
    backend="maxtext",
    phase="setup",
    condition=_folding_block,
    backend_versions=TESTED,
    target="maxtext.models.llama2.Attention",
    tags=("model",),
)
def query_scale_at_run_time(ctx: PatchContext) -> None:
    """Llama and Mixtral attention scale the queries at run time where the model loads a
    Primus HF import (its query weights as HF has them), not through folded weights."""
    module = FOLDED_BLOCKS[str(get_param(ctx, "decoder_block")).lower()]
    ctx.wrap(module, "Attention", _with_run_time_scale, within=module)
