"""The modules the torchtitan turbo patches swap in (imports torchtitan: load only from a
patch handler). Each subclasses the upstream class and changes only its forward (the loss: its
`fn`), so parameter names, initialisation and sharding configs are the upstream's; DTensor
inputs take the upstream forward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.distributed.tensor import DTensor
from torchtitan.components.loss import IGNORE_INDEX, CrossEntropyLoss, cross_entropy_loss
from torchtitan.config import CompileConfig
from torchtitan.distributed.spmd_types import spmd_mesh_size
from torchtitan.distributed.utils import get_spmd_backend
from torchtitan.models.common import FeedForward, RMSNorm
from torchtitan.models.common.linear import Linear

from primus.turbo.kernels.cross_entropy import cross_entropy
from primus.turbo.kernels.fp8_linear import fp8_linear
from primus.turbo.kernels.rms_norm import rms_norm
from primus.turbo.kernels.swiglu import swiglu


class TurboRMSNorm(RMSNorm):
    """TorchTitan's RMSNorm through the Triton kernel."""

    @dataclass(kw_only=True, slots=True)
    class Config(RMSNorm.Config):
        pass

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if isinstance(x, DTensor):
            return super().forward(x)
        return rms_norm(x, self.weight, self.eps)


class TurboFeedForward(FeedForward):
    """TorchTitan's FeedForward with the Triton SwiGLU: `w2(swiglu(w1(x), w3(x)))`."""

    @dataclass(kw_only=True, slots=True)
    class Config(FeedForward.Config):
        pass

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if isinstance(x, DTensor):
            return super().forward(x)
        return self.w2(swiglu(self.w1(x), self.w3(x)))


def turbo_cross_entropy_loss(
    pred: torch.Tensor, labels: torch.Tensor, *, global_vocab_size: int | None = None
) -> torch.Tensor:
    """`cross_entropy_loss` (sum over tokens, IGNORE_INDEX skipped) through the Triton
    kernel; vocab-parallel logits keep TorchTitan's loss-parallel paths."""
    if isinstance(pred, DTensor) or (
        get_spmd_backend() == "spmd_types" and spmd_mesh_size("tp") > 1
    ):
        return cross_entropy_loss(pred, labels, global_vocab_size=global_vocab_size)
    return cross_entropy(pred, labels, ignore_index=IGNORE_INDEX, reduction="sum")


class TurboCrossEntropyLoss(CrossEntropyLoss):
    """TorchTitan's CrossEntropyLoss (divided by the global valid-token count, so gradient
    accumulation and data parallelism are unchanged) with the Triton cross-entropy."""

    @dataclass(kw_only=True, slots=True)
    class Config(CrossEntropyLoss.Config):
        pass

    def __init__(self, config: Config, *, compile_config: CompileConfig | None = None):
        super().__init__(config)
        self.fn = turbo_cross_entropy_loss
        self._maybe_compile(compile_config)


class TurboFP8Linear(Linear):
    """TorchTitan's Linear with FP8 GEMMs (`fp8_linear`, the weight's FP8 copies kept until
    the next optimizer step)."""

    @dataclass(kw_only=True, slots=True)
    class Config(Linear.Config):
        fp8_recipe: str = "tensorwise"

    def __init__(self, config: Config):
        super().__init__(config)
        self.fp8_recipe = config.fp8_recipe

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if isinstance(x, DTensor) or isinstance(self.weight, DTensor):
            return super().forward(x)
        return fp8_linear(x, self.weight, self.bias, self.fp8_recipe, cache_weight=True)


# Feature -> (upstream class, its turbo subclass).
REPLACEMENTS = {
    "rms_norm": (RMSNorm, TurboRMSNorm),
    "swiglu": (FeedForward, TurboFeedForward),
    "cross_entropy": (CrossEntropyLoss, TurboCrossEntropyLoss),
    "fp8": (Linear, TurboFP8Linear),
}
