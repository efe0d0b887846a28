"""Attention's 1/sqrt(head_dim) on the queries at run time, as transformers, Megatron-LM and
TorchTitan apply it, for a model that starts from Primus's HF import.

MaxText's Llama and Mixtral fold that scale into the query projection's weights: its HF
conversion scales them and its initializer divides them. The model computes the same, but
Adam's step does not scale with the weights, so folded queries train sqrt(head_dim) times
faster and the loss curve leaves the HF model's. Primus's import keeps the weights as HF has
them and says so in the import folder (`RECORD`); a model loading that import scales its
queries at run time (MaxText's own `query_pre_attn_scalar`). An import made without the record,
a `load_parameters_path` of the user's and a model trained from scratch keep MaxText's folding.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from primus.backends.maxtext.maxtext_adapter import TESTED
from primus.core.patches import PatchContext, get_param, register_patch

RECORD = "query_scale.json"  # in an import folder: its query weights leave the scale out
FOLDED_BLOCKS = {"llama2": "maxtext.models.llama2", "mixtral": "maxtext.models.mixtral"}
CONVERSION_HOOK = "scale_query_layer"  # MaxText's conversion hook that folds the scale


def write_record(import_folder: Path) -> None:
    """Record in an import folder that its query weights are HF's, unscaled."""
    (import_folder / RECORD).write_text(json.dumps({"query_scale": "at run time"}) + "\n")


def scaled_at_run_time(config: Any) -> bool:
    """Whether the model of MaxText `config` loads an import whose queries are HF's, unscaled
    (`load_parameters_path` is `<import folder>/<step>/items`)."""
    path = getattr(config, "load_parameters_path", "")
    return bool(path) and (Path(path).parent.parent / RECORD).is_file()


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
