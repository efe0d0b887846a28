"""Llama-3 RoPE scaling with the model's own factor: MaxText 0.2.5 hard-codes 8 (Llama 3.1's),
so Llama 3.2 (factor 32) needs `rope_scaling_factor`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from primus.backends.maxtext.maxtext_adapter import TESTED
from primus.core.config import ParamSpec, register_params
from primus.core.patches import PatchContext, get_param, register_patch

register_params(
    "maxtext",
    {
        "rope_scaling_factor": ParamSpec(
            float,
            "Llama-3 RoPE scaling factor for rope_type llama3.1 (rope_scaling.factor in the HF "
            "config.json); MaxText alone hard-codes 8",
        )
    },
)


def _llama3_factor_set(ctx: PatchContext) -> bool:
    """rope_scaling_factor is set and rope_type is llama3.1"""
    rope_type = str(get_param(ctx, "rope_type", "default")).lower()
    return get_param(ctx, "rope_scaling_factor") is not None and rope_type.startswith("llama3.1")


def _llama3_scaling(factor: float) -> Callable[[Any, Any], Any]:
    """LLaMARotaryEmbedding._apply_scaling_factor with `factor` (the low and high frequency
    factors 1 and 4 and the original context 8192 are every Llama 3.x model's)."""

    def _apply_scaling_factor(self: Any, freq: Any) -> Any:
        import jax.numpy as jnp

        low_freq_factor, high_freq_factor, old_context_len = 1.0, 4.0, 8192.0
        wavelen = 2 * jnp.pi / freq
        smooth = (old_context_len / wavelen - low_freq_factor) / (
            high_freq_factor - low_freq_factor
        )
        low = jnp.where(
            wavelen > old_context_len / low_freq_factor,
            freq / factor,
            (1 - smooth) * freq / factor + smooth * freq,
        )
        return jnp.where(wavelen < old_context_len / high_freq_factor, freq, low)

    return _apply_scaling_factor


@register_patch(
    "maxtext.llama3_rope_factor",
    backend="maxtext",
    phase="setup",
    condition=_llama3_factor_set,
    backend_versions=TESTED,
    target="maxtext.layers.embeddings.LLaMARotaryEmbedding._apply_scaling_factor",
    tags=("model",),
)
def llama3_rope_factor(ctx: PatchContext) -> None:
    """Llama-3 RoPE scaling with the model's factor (rope_scaling_factor), not MaxText's
    hard-coded 8, so Llama 3.2 presets get HF's rotary frequencies."""
    from maxtext.layers.embeddings import LLaMARotaryEmbedding

    factor = float(get_param(ctx, "rope_scaling_factor"))
    ctx.replace(LLaMARotaryEmbedding, "_apply_scaling_factor", _llama3_scaling(factor))
