"""`attention: autoselected` on NVIDIA GPUs: cuDNN's flash attention through JAX.

MaxText 0.2.5 autoselects tokamax's Pallas-Triton flash attention on every GPU. JAX's own
cuDNN flash attention (MaxText's `cudnn_flash_jax`, `jax.nn.dot_product_attention` with
`implementation="cudnn"`) computes the same attention 1.17x faster end to end on the Llama 3.2
1B recipe on an H100, with the same losses (docs/benchmarks/maxtext.md). cuDNN is NVIDIA's
only, so the choice is made where an NVIDIA driver is visible; `attention: flash` keeps
tokamax's kernel.
"""

from __future__ import annotations

import os

from primus.backends.maxtext.maxtext_adapter import TESTED
from primus.core.patches import PatchContext, get_param, register_patch

NVIDIA_DRIVER = "/dev/nvidiactl"  # the NVIDIA driver's control node: JAX's CUDA backend needs it


def autoselected_on_nvidia(ctx: PatchContext) -> bool:
    """hardware is a GPU, attention is autoselected and an NVIDIA driver is visible"""
    hardware = str(get_param(ctx, "hardware", "tpu"))
    autoselected = get_param(ctx, "attention", "autoselected") == "autoselected"
    return hardware.startswith("gpu") and autoselected and os.path.exists(NVIDIA_DRIVER)


@register_patch(
    "maxtext.cudnn_attention",
    backend="maxtext",
    phase="setup",
    condition=autoselected_on_nvidia,
    backend_versions=TESTED,
    target="MaxText config attention",
    tags=("performance",),
)
def cudnn_attention(ctx: PatchContext) -> None:
    """`attention: cudnn_flash_jax` where MaxText would autoselect tokamax's Triton kernel on an
    NVIDIA GPU: JAX's cuDNN flash attention, 1.17x the 1B recipe's tokens/s on an H100."""
    ctx.set_param("attention", "cudnn_flash_jax",
                  "autoselected on an NVIDIA GPU: cuDNN's flash attention (attention: flash keeps "
                  "tokamax's)")  # fmt: skip
