"""Where TorchTitan runs: on the GPU as upstream intends, or on the CPU with gloo."""

from __future__ import annotations

from primus.core.devices import wants_cpu
from primus.core.logging import log_rank_0
from primus.core.patches import TESTED, PatchContext, register_patch


@register_patch(
    "torchtitan.cpu",
    backend="torchtitan",
    phase="setup",
    condition=wants_cpu,
    backend_versions=TESTED,
    target="torchtitan.tools.utils.device_type, FlexAttention, varlen_attn, "
    "fsdp.disable_fsdp_gradient_division",
    tags=("device",),
)
def cpu(ctx: PatchContext) -> None:
    """Train on the CPU with gloo: device type cpu, attention through SDPA (FlexAttention has no
    CPU backward, varlen attention no CPU kernel), FSDP2 reducing with a plain sum (gloo has no
    PREMUL_SUM)."""
    from primus.backends.torchtitan import cpu as shims

    shims.enable_cpu(ctx)
    log_rank_0("[torchtitan] cpu: device cpu, gloo, SDPA attention, FSDP sum reduction")
