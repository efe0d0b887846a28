"""`turbo.fp8` and `turbo.fp8_recipe`, shared by the backends, and the check that refuses FP8
where the hardware has none.

FP8 runs the linear layers of the transformer blocks, except those of the first and the last
block, through `primus.turbo.kernels.fp8_linear`; the embedding, the first and last blocks and
the output projection (the LM head) stay bf16, the layers whose precision matters most.
"""

from __future__ import annotations

import functools

from primus.core.config import ParamSpec
from primus.core.devices import wants_cpu
from primus.core.errors import ConfigError
from primus.core.patches import PatchContext, get_param

FP8 = {
    "fp8": "FP8 GEMMs (torch._scaled_mm, current scaling) in the transformer blocks' linear "
    "layers but the first and last block's; not bf16's numerics"
}
PARAMS = {
    "turbo.fp8_recipe": ParamSpec(
        str,
        "FP8 scaling while turbo.fp8 is true: tensorwise (one scale per tensor from this "
        "call's amax, gradients in e5m2), delayed (tensorwise from the largest amax of the "
        "layer's last 16 calls, recorded as it casts: no amax pass; not under torch.compile) "
        "or rowwise (one scale per row, all e4m3)",
        choices=("tensorwise", "delayed", "rowwise"),
        default="tensorwise",
    )
}


@functools.cache
def cpu_has_fp8(recipe: str) -> bool:
    """Whether this torch multiplies FP8 matrices on the CPU (`torch._scaled_mm`) with the
    recipe's scales (one per tensor, or one per row)."""
    import torch

    a = torch.zeros(16, 16, dtype=torch.float8_e4m3fn)
    one = torch.ones((), dtype=torch.float32)
    rows, cols = (torch.ones(16, 1), torch.ones(1, 16)) if recipe == "rowwise" else (one, one)
    try:
        torch._scaled_mm(a, a.t(), scale_a=rows, scale_b=cols, out_dtype=torch.bfloat16)
    except (RuntimeError, NotImplementedError, ValueError):
        return False
    return True


def fp8_problem(ctx: PatchContext, recipe: str) -> str | None:
    """Why this run cannot compute in FP8 with `recipe` (None: it can)."""
    import torch

    if wants_cpu(ctx):
        if cpu_has_fp8(recipe):
            return None
        scales = "row-wise" if recipe == "rowwise" else "tensor-wise"
        return f"torch {torch.__version__} has no {scales} FP8 GEMM on the CPU"
    if torch.version.hip:
        return "FP8 (e4m3fn/e5m2 through torch._scaled_mm) is not supported on ROCm by turbo"
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) < (8, 9):
        name = torch.cuda.get_device_name()
        return f"{name} (compute capability {major}.{minor}) has no FP8 tensor cores"
    return None


def fp8_recipe(ctx: PatchContext) -> str:
    """The run's FP8 recipe; a one-line ConfigError (exit 2) where FP8 cannot run."""
    recipe = str(get_param(ctx, "turbo.fp8_recipe", "tensorwise"))
    problem = fp8_problem(ctx, recipe)
    if problem:
        raise ConfigError(
            f"turbo.fp8: {problem} (FP8 needs a GPU of compute capability 8.9 or newer); "
            "set turbo.fp8: false"
        )
    return recipe
