"""Tied-embedding logits in the run's precision: MaxText 0.2.5 casts the embedding table to
bfloat16 for them (`attend_on_embedding`) even in a float32 run."""

from __future__ import annotations

from typing import Any

from primus.backends.maxtext.maxtext_adapter import TESTED
from primus.core.patches import PatchContext, get_param, register_patch


def _tied_in_float32(ctx: PatchContext) -> bool:
    """logits_via_embedding is true and dtype is float32"""
    return bool(get_param(ctx, "logits_via_embedding")) and get_param(ctx, "dtype") == "float32"


def _attend_on_embedding(
    query: Any, embedding_table: Any, attend_dtype: Any, config: Any, out_sharding: Any = None
) -> Any:
    """MaxText's `attend_on_embedding`, with the table in its own dtype (no bfloat16 cast)."""
    import jax.numpy as jnp

    from maxtext.common.common_types import ShardMode
    from maxtext.layers import embeddings

    if config.shard_mode != ShardMode.EXPLICIT:
        out_sharding = None
    if out_sharding is not None:
        out_sharding = embeddings.truncate_out_sharding(out_sharding, query.ndim)
    table = embeddings._maybe_move_embedding_to_device(embedding_table, config)
    return jnp.dot(query, table.T, preferred_element_type=attend_dtype, out_sharding=out_sharding)


@register_patch(
    "maxtext.tied_logits_dtype",
    backend="maxtext",
    phase="setup",
    condition=_tied_in_float32,
    backend_versions=TESTED,
    target="maxtext.layers.embeddings.attend_on_embedding",
    tags=("model",),
)
def tied_logits_dtype(ctx: PatchContext) -> None:
    """Tied-embedding logits of a float32 run in float32, as transformers computes them (MaxText
    rounds the table to bfloat16: logits about 1e-3 off an imported HF model's)."""
    ctx.replace("maxtext.layers.embeddings", "attend_on_embedding", _attend_on_embedding)
