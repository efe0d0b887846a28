"""What every kernel module shares: when Triton runs, launch sizes, the custom-op namespace."""

from __future__ import annotations

import os

import torch

# Kernels are `torch.library.custom_op`s in this namespace, so torch.compile keeps them whole.
OPS = "primus_turbo"


# Triton decides at `@triton.jit` time whether a kernel is interpreted, so this is read once,
# when the kernels are defined (the first import of primus.turbo.kernels).
_INTERPRETING = os.environ.get("TRITON_INTERPRET", "0") == "1"


def interpreting() -> bool:
    """The kernels were defined under Triton's CPU interpreter (`TRITON_INTERPRET=1`)."""
    return _INTERPRETING


def on_triton(*tensors: torch.Tensor) -> bool:
    """Whether these tensors go to a Triton kernel: on a GPU, or anywhere under the interpreter.

    Elsewhere (CPU without the interpreter) the public functions use their PyTorch reference.
    """
    if interpreting():
        return True
    return all(t.device.type in ("cuda", "xpu") for t in tensors)


def row_launch(width: int, itemsize: int) -> tuple[int, int]:
    """(BLOCK, num_warps) for a kernel that holds one row of `width` elements in registers."""
    import triton

    block = triton.next_power_of_2(width)
    if interpreting():
        return block, 1
    nbytes = block * max(itemsize, 2)
    warps = 4 if nbytes <= 8192 else 8 if nbytes <= 32768 else 16
    return block, warps
