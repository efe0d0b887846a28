"""What TorchTitan needs to train on CPU with gloo (torchtitan 0.3).

1. The device type defaults to "cuda" (`torchtitan.tools.utils.device_type`, copied by value into
   the modules that import it): it becomes "cpu", with a small device module for the memory
   monitor (peak RSS stands in for device memory).
2. FlexAttention has no CPU backward: attention runs through SDPA over the block mask made dense,
   and the block mask is built without torch.compile.
3. FSDP2 reduces gradients with PREMUL_SUM, which gloo lacks: FSDP modules force a sum.
"""

from __future__ import annotations

import os
import platform
import resource
import sys
from types import SimpleNamespace
from typing import Any


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def _cpu_device_module() -> SimpleNamespace:
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")

    def stats(*_: Any) -> dict[str, int]:
        return {"active_bytes.all.peak": _peak_rss(), "reserved_bytes.all.peak": _peak_rss()}

    nothing = lambda *_: None  # noqa: E731
    return SimpleNamespace(
        get_device_name=lambda *_: platform.processor() or "cpu",
        current_device=lambda: 0,
        device_count=lambda: 1,
        is_available=lambda: True,
        get_device_properties=lambda *_: SimpleNamespace(total_memory=total),
        memory_stats=stats,
        reset_peak_memory_stats=nothing,
        empty_cache=nothing,
        set_device=nothing,
        synchronize=nothing,
    )


def use_cpu_device() -> None:
    """Point every loaded torchtitan module's `device_type`/`device_module` at the CPU."""
    import torchtitan.trainer  # noqa: F401  (loads the modules that copy the names)
    from torchtitan.tools import utils

    old_type, old_module = utils.device_type, utils.device_module
    cpu_module = _cpu_device_module()
    for name, module in list(sys.modules.items()):
        if not name.startswith("torchtitan") or module is None:
            continue
        if getattr(module, "device_type", None) is old_type:
            vars(module)["device_type"] = "cpu"
        if getattr(module, "device_module", None) is old_module:
            vars(module)["device_module"] = cpu_module


def _dense_flex_attention(
    q: Any,
    k: Any,
    v: Any,
    *,
    block_mask: Any,
    scale: Any,
    enable_gqa: bool,
    return_aux: Any,
    **_: Any,
) -> tuple[Any, Any]:
    import torch.nn.functional as F
    from torch.nn.attention.flex_attention import create_mask

    if return_aux is not None and getattr(return_aux, "lse", False):
        raise NotImplementedError("attention with a log-sum-exp output has no CPU path")
    mask = None
    if block_mask is not None:
        mask = create_mask(
            block_mask.mask_mod, q.shape[0], 1, q.shape[2], k.shape[2], device=q.device
        )
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, scale=scale, enable_gqa=enable_gqa
    )
    return out, None


def use_dense_attention() -> None:
    """FlexAttention -> SDPA over the dense mask; block masks built eagerly."""
    from torch.nn.attention.flex_attention import create_block_mask

    from torchtitan.models.common import attention

    attention.FlexAttention.compiled_flex_attn = staticmethod(_dense_flex_attention)
    attention._compiled_create_block_mask = create_block_mask


def force_fsdp_sum_reduction() -> None:
    """FSDP modules reduce with a plain sum (torchtitan already divides gradients itself)."""
    from torch.distributed.fsdp import FSDPModule

    from torchtitan.distributed import fsdp

    original = fsdp.disable_fsdp_gradient_division
    if getattr(original, "primus_cpu", False):
        return

    def disable_division_and_sum(model: Any) -> None:
        original(model)
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.set_force_sum_reduction_for_comms(True)

    disable_division_and_sum.primus_cpu = True  # type: ignore[attr-defined]
    fsdp.disable_fsdp_gradient_division = disable_division_and_sum


def enable_cpu() -> None:
    use_cpu_device()
    use_dense_attention()
    force_fsdp_sum_reduction()
