"""Megatron from the PyPI wheel, without Transformer Engine or Apex: what must change."""

from __future__ import annotations

import importlib.util

from primus.core.logging import get_logger, log_rank_0
from primus.core.patches import PatchContext, register_patch

# Settings whose kernels come from Transformer Engine or Apex: the value without them, and why.
TE_OR_APEX_KERNELS = {
    "apply_rope_fusion": (False, "the fused RoPE kernel is Transformer Engine's"),
    "masked_softmax_fusion": (False, "the fused masked softmax is Transformer Engine's or Apex's"),
    "gradient_accumulation_fusion": (False, "fused weight-gradient accumulation is Apex's or TE's"),
    "no_persist_layer_norm": (True, "the persistent layer norm kernel is Apex's"),
}


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _no_te(ctx: PatchContext) -> bool:
    """transformer_engine is not installed"""
    return not _installed("transformer_engine")


def _no_te_nor_apex(ctx: PatchContext) -> bool:
    """neither transformer_engine nor apex is installed"""
    return _no_te(ctx) and not _installed("apex")


def _turn_off(ctx: PatchContext, key: str, value: object, reason: str) -> None:
    """Set params[key] = value, warning when that overrides what the config asked for."""
    asked = ctx.params.get(key)
    if asked is not None and asked != value:
        get_logger().warning(f"[megatron] {key}: {asked} -> {value}: {reason}")
    else:
        log_rank_0(f"[megatron] {key}: {value} ({reason})")
    ctx.params[key] = value


@register_patch(
    "megatron.local_layers_without_te",
    backend="megatron",
    phase="setup",
    condition=_no_te,
    target="megatron args: transformer_impl",
    tags=("fallback",),
)
def local_layers_without_te(ctx: PatchContext) -> None:
    """Build layers from Megatron's own modules (local spec) when Transformer Engine is absent."""
    if ctx.params.get("transformer_impl", "transformer_engine") == "transformer_engine":
        _turn_off(ctx, "transformer_impl", "local", "transformer_engine is not installed")


@register_patch(
    "megatron.fusions_without_te",
    backend="megatron",
    phase="setup",
    condition=_no_te_nor_apex,
    target="megatron args: " + ", ".join(TE_OR_APEX_KERNELS),
    tags=("fallback",),
)
def fusions_without_te(ctx: PatchContext) -> None:
    """Turn off the fusions whose kernels only Transformer Engine or Apex provide."""
    for key, (value, reason) in TE_OR_APEX_KERNELS.items():
        if ctx.params.get(key) != value:
            _turn_off(ctx, key, value, reason + "; neither is installed")


def _helpers_prebuilt(ctx: PatchContext) -> bool:
    """the wheel ships the compiled dataset helper"""
    return _installed("megatron.core.datasets.helpers_cpp")


@register_patch(
    "megatron.prebuilt_dataset_helpers",
    backend="megatron",
    phase="build_args",
    condition=_helpers_prebuilt,
    target="megatron.core.datasets.utils.compile_helpers",
    tags=("fallback",),
)
def prebuilt_dataset_helpers(ctx: PatchContext) -> None:
    """Skip compiling the dataset helper: the wheel ships it compiled, and no Makefile."""
    from megatron.core.datasets import utils

    utils.compile_helpers = lambda: None
