"""Megatron from the PyPI wheel, without Transformer Engine or Apex: what must change."""

from __future__ import annotations

import importlib.util

from primus.core.patches import TESTED, PatchContext, register_patch

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
        ctx.set_param("transformer_impl", "local", "transformer_engine is not installed")


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
            ctx.set_param(key, value, reason + "; neither is installed")


def _helpers_prebuilt(ctx: PatchContext) -> bool:
    """the wheel ships the compiled dataset helper"""
    return _installed("megatron.core.datasets.helpers_cpp")


@register_patch(
    "megatron.prebuilt_dataset_helpers",
    backend="megatron",
    phase="build_args",
    condition=_helpers_prebuilt,
    backend_versions=TESTED,
    target="megatron.core.datasets.utils.compile_helpers",
    tags=("fallback",),
)
def prebuilt_dataset_helpers(ctx: PatchContext) -> None:
    """Skip compiling the dataset helper: the wheel ships it compiled, and no Makefile."""
    ctx.replace("megatron.core.datasets.utils", "compile_helpers", _compiled_already)


def _compiled_already() -> None:
    """compile_helpers' stand-in: the helper is already compiled."""
