"""What TorchTitan needs to train on CPU with gloo (torchtitan 0.3).

1. The device type defaults to "cuda" (`torchtitan.tools.utils.device_type`, copied by value into
   the modules that import it): it becomes "cpu", with a small device module for the memory
   monitor (peak RSS stands in for device memory).
2. FlexAttention has no CPU backward, varlen attention no CPU kernel: attention runs through SDPA
   over the mask made dense (the block mask, or the documents of varlen's packed sequence), and
   the block mask is built without torch.compile.
3. FSDP2 reduces gradients with PREMUL_SUM, which gloo lacks: FSDP modules force a sum.

Each change goes through the patch engine (`ctx.replace` / `ctx.wrap`), which rebinds the
modules that copied a name too.
"""

from __future__ import annotations

import os
import platform
import resource
from types import SimpleNamespace
from typing import Any

from primus.core.patches import PatchContext


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


def use_cpu_device(ctx: PatchContext) -> None:
    """Point every loaded torchtitan module's `device_type`/`device_module` at the CPU."""
    import torchtitan.trainer  # noqa: F401  (loads the modules that copy the names)

    ctx.replace("torchtitan.tools.utils", "device_type", "cpu")
    ctx.replace("torchtitan.tools.utils", "device_module", _cpu_device_module())


def _refuse_log_sum_exp(asked: bool) -> None:
    if asked:
        raise NotImplementedError("attention with a log-sum-exp output has no CPU path")


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

    _refuse_log_sum_exp(return_aux is not None and getattr(return_aux, "lse", False))
    mask = None
    if block_mask is not None:
        mask = create_mask(
            block_mask.mask_mod, q.shape[0], 1, q.shape[2], k.shape[2], device=q.device
        )
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, scale=scale, enable_gqa=enable_gqa
    )
    return out, None


def _dense_varlen_attention(
    q: Any,
    k: Any,
    v: Any,
    cu_seq_q: Any,
    cu_seq_k: Any,
    max_q: int,
    max_k: int,
    *,
    scale: Any = None,
    window_size: tuple[int, int] = (-1, -1),
    enable_gqa: bool = False,
    return_aux: Any = None,
    **_: Any,
) -> Any:
    """`varlen_attn` on packed (tokens, heads, head_dim) documents: each query attends to the
    keys of its own document within the window (left, right; -1: unlimited)."""
    import torch
    import torch.nn.functional as F

    _refuse_log_sum_exp(return_aux is not None)

    def document_positions(cu_seq: Any, tokens: int) -> tuple[Any, Any]:
        index = torch.arange(tokens, device=cu_seq.device)
        document = torch.searchsorted(cu_seq[1:], index, right=True)
        return document, index - cu_seq[document]

    doc_q, pos_q = document_positions(cu_seq_q, q.shape[0])
    doc_k, pos_k = document_positions(cu_seq_k, k.shape[0])
    offset = pos_k[None, :] - pos_q[:, None]  # key position - query position
    left, right = window_size
    mask = doc_q[:, None] == doc_k[None, :]
    if left >= 0:
        mask &= offset >= -left
    if right >= 0:
        mask &= offset <= right
    batch = [t.transpose(0, 1).unsqueeze(0) for t in (q, k, v)]  # (1, heads, tokens, dim)
    out = F.scaled_dot_product_attention(
        batch[0], batch[1], batch[2], attn_mask=mask, scale=scale, enable_gqa=enable_gqa
    )
    return out.squeeze(0).transpose(0, 1)


def use_dense_attention(ctx: PatchContext) -> None:
    """FlexAttention and varlen attention -> SDPA over the dense mask; block masks built
    eagerly."""
    from torch.nn.attention.flex_attention import create_block_mask

    from torchtitan.models.common import attention

    ctx.replace(attention.FlexAttention, "compiled_flex_attn", staticmethod(_dense_flex_attention))
    ctx.replace(attention, "_compiled_create_block_mask", create_block_mask)
    ctx.replace(attention, "varlen_attn", _dense_varlen_attention)


def _sum_reduction(original: Any) -> Any:
    """`disable_fsdp_gradient_division`, then every FSDP module reduces with a plain sum."""
    from torch.distributed.fsdp import FSDPModule

    def disable_division_and_sum(model: Any) -> None:
        original(model)
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.set_force_sum_reduction_for_comms(True)

    return disable_division_and_sum


def enable_cpu(ctx: PatchContext) -> None:
    """All three, through the patch engine (applying again changes nothing)."""
    use_cpu_device(ctx)
    use_dense_attention(ctx)
    ctx.wrap("torchtitan.distributed.fsdp", "disable_fsdp_gradient_division", _sum_reduction)
