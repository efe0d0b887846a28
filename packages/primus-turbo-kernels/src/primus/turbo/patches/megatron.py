"""Turbo kernels in Megatron's local (non-Transformer-Engine) layers."""

from __future__ import annotations

from primus.turbo.switches import register_switches

FEATURES = {
    "rms_norm": "Triton RMSNorm in every norm of the local spec",
    "swiglu": "Triton SwiGLU in the MLP",
    "rope": "Triton rotary embedding",
    "attention": "PyTorch SDPA flash/efficient attention as the core attention",
    "cross_entropy": "Triton cross-entropy for the language-model loss",
    "optimizer": "fused Adam and foreach grad-norm/scale instead of the Python fallbacks",
}
register_switches("megatron", FEATURES)
