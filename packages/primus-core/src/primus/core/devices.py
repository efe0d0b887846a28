"""The `device` param that torch-based backends share, and the condition their CPU patches use."""

from __future__ import annotations

import functools

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
    return not gpu_visible()


@functools.cache
def gpu_visible() -> bool:
    """Whether this process sees a GPU, asked once: a backend's CPU patch makes torch.cuda
    answer on the CPU (`is_available()` then says yes), and every later question must still
    get the answer of the hardware."""
    import torch  # only when asked: importing primus.core never imports torch

    return torch.cuda.is_available()
