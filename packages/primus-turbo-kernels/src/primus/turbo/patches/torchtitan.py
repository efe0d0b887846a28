"""Turbo kernels in TorchTitan's Llama models."""

from __future__ import annotations

from primus.turbo.switches import register_switches

FEATURES = {
    "rms_norm": "Triton RMSNorm in every norm",
    "swiglu": "Triton SwiGLU as the feed-forward activation",
    "cross_entropy": "Triton cross-entropy as the loss",
}
register_switches("torchtitan", FEATURES)
