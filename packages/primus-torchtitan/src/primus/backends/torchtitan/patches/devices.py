"""Where TorchTitan runs: on the GPU as upstream intends, or on the CPU with gloo."""

from __future__ import annotations

from primus.core.devices import wants_cpu
from primus.core.logging import log_rank_0
from primus.core.patches import PatchContext, register_patch

TESTED = ">=0.3,<0.4"  # the torchtitan versions these patches were tested on


@register_patch(
    "torchtitan.cpu",
    backend="torchtitan",
    phase="setup",
    condition=wants_cpu,
    backend_versions=TESTED,
    target="torchtitan.tools.utils.device_type, FlexAttention, fsdp.disable_fsdp_gradient_division",
    tags=("device",),
)
def cpu(ctx: PatchContext) -> None:
    """Train on the CPU with gloo: device type cpu, attention through SDPA (FlexAttention has no
    CPU backward), FSDP2 reducing with a plain sum (gloo has no PREMUL_SUM)."""
    from primus.backends.torchtitan import cpu as shims

    shims.enable_cpu()
    log_rank_0("[torchtitan] cpu: device cpu, gloo, SDPA attention, FSDP sum reduction")
