"""The `device` param that torch-based backends share, and the condition their CPU patches use."""

from __future__ import annotations

from primus.core.config.schema import ParamSpec
from primus.core.patches.patch import PatchContext, get_param

DEVICE_PARAM = ParamSpec(
    str,
    "where to train: auto (the GPU when there is one, else CPU), cuda or cpu",
    choices=("auto", "cuda", "cpu"),
    default="auto",
)


def wants_cpu(ctx: PatchContext) -> bool:
    """device is cpu, or auto and no GPU is visible"""
    device = get_param(ctx, "device", "auto")
    if device != "auto":
        return device == "cpu"
    import torch  # only when asked: importing primus.core never imports torch

    return not torch.cuda.is_available()
