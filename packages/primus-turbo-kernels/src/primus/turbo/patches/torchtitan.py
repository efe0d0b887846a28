"""Turbo kernels in TorchTitan's models and loss.

TorchTitan 0.3 builds every module from a config tree: `X.Config(...).build()` constructs `X`.
Each patch swaps, at `build_args` (before `trainer.init` builds anything), the config nodes of
exactly one upstream class in `Trainer.Config` (the model under `model_spec`, and `loss`) for a
subclass whose forward runs the Triton kernel, as TorchTitan's own `override.imports` does.
Parameter names, initialisation and sharding configs carry over (`derive`), so checkpoints and
FSDP2 are unchanged. The kernels are custom ops, so torch.compile keeps them in its graph.
DTensor inputs (tensor parallel with `parallelism.spmd_backend` partial_dtensor/full_dtensor)
take the upstream forward; the default spmd_types backend hands modules plain local tensors.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from primus.core.logging import log_rank_0
from primus.core.patches import PatchContext, get_args, register_patch
from primus.turbo.switches import register_switches, switch

FEATURES = {
    "rms_norm": "Triton RMSNorm in every norm",
    "swiglu": "Triton SwiGLU as the feed-forward activation",
    "cross_entropy": "Triton cross-entropy as the loss",
}
register_switches("torchtitan", FEATURES)
TESTED = ">=0.3,<0.4"  # the module and loss classes subclassed here are torchtitan 0.3's


@cache
def turbo_classes() -> dict[str, tuple[type, type]]:
    """Feature -> (upstream class, its turbo subclass). Imports torch, TorchTitan and kernels."""
    from dataclasses import dataclass

    import torch
    from torch.distributed.tensor import DTensor
    from torchtitan.components.loss import IGNORE_INDEX, CrossEntropyLoss, cross_entropy_loss
    from torchtitan.config import CompileConfig
    from torchtitan.distributed.spmd_types import spmd_mesh_size
    from torchtitan.distributed.utils import get_spmd_backend
    from torchtitan.models.common import FeedForward, RMSNorm

    from primus.turbo.kernels.cross_entropy import cross_entropy
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

    return {
        "rms_norm": (RMSNorm, TurboRMSNorm),
        "swiglu": (FeedForward, TurboFeedForward),
        "cross_entropy": (CrossEntropyLoss, TurboCrossEntropyLoss),
    }


def swap_configs(config: Any, feature: str) -> list[str]:
    """Replace every node of exactly the upstream class's Config in `config` by the turbo
    class's (fields copied); returns their paths. Nodes already swapped are left alone."""
    from torchtitan.config import derive

    upstream, turbo = turbo_classes()[feature]
    nodes = [node for node in config.traverse(upstream.Config) if type(node[1]) is upstream.Config]
    for _, node, parent, attr in nodes:
        replacement = derive(node, turbo.Config)
        if isinstance(parent, list):
            parent[attr] = replacement
        else:
            setattr(parent, attr, replacement)
    return [path for path, *_ in nodes]


def _swap(ctx: PatchContext, feature: str) -> None:
    paths = swap_configs(get_args(ctx), feature)
    upstream, turbo = turbo_classes()[feature]
    log_rank_0(f"[turbo] {feature}: {upstream.__name__} -> {turbo.__name__} in {len(paths)} places")


def _turbo(feature: str, target: str) -> Any:
    """register_patch for a torchtitan turbo feature: its id, switch, phase, gate and tag."""
    return register_patch(
        f"torchtitan.turbo_{feature}",
        backend="torchtitan",
        phase="build_args",
        condition=switch(feature),
        backend_versions=TESTED,
        target=target,
        tags=("turbo",),
    )


@_turbo("rms_norm", "torchtitan.models.common.nn_modules.RMSNorm")
def turbo_rms_norm(ctx: PatchContext) -> None:
    """Every RMSNorm of the model (layer norms, final norm, QK-norms) runs the Triton kernel."""
    _swap(ctx, "rms_norm")


@_turbo("swiglu", "torchtitan.models.common.feed_forward.FeedForward")
def turbo_swiglu(ctx: PatchContext) -> None:
    """Every dense feed-forward computes silu(w1(x)) * w3(x) with the Triton SwiGLU kernel."""
    _swap(ctx, "swiglu")


@_turbo("cross_entropy", "torchtitan.components.loss.CrossEntropyLoss")
def turbo_cross_entropy(ctx: PatchContext) -> None:
    """The training loss (each chunk of ChunkedLossWrapper) runs the Triton cross-entropy."""
    _swap(ctx, "cross_entropy")
