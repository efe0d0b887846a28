"""Where TorchTitan runs: on the GPU as upstream intends (with the attention kernels that are
installed), or on the CPU with gloo."""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Callable

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
    from primus.backends.torchtitan.devices import cpu as shims

    shims.enable_cpu(ctx)
    log_rank_0("[torchtitan] cpu: device cpu, gloo, SDPA attention, FSDP sum reduction")


FLASH_ATTENTION_MODULES = {"FA3": "flash_attn_interface", "FA4": "flash_attn.cute.interface"}


@register_patch(
    "torchtitan.flash_attention_impl",
    backend="torchtitan",
    phase="setup",
    backend_versions=TESTED,
    target="torchtitan.tools.utils.get_cuda_flash_attention_impl",
    tags=("device",),
)
def flash_attention_impl(ctx: PatchContext) -> None:
    """Varlen attention activates FA3 (Hopper) or FA4 (Blackwell) only where that kernel's
    package is installed; otherwise torch's own kernels run it (cuDNN or FlashAttention 2)
    instead of the model build failing on the missing import."""
    ctx.wrap("torchtitan.tools.utils", "get_cuda_flash_attention_impl", installed_only)


def installed_only(original: Callable[[], str | None]) -> Callable[[], str | None]:
    """`original`, but None where the implementation it names is not importable."""

    def impl_if_installed() -> str | None:
        impl = original()
        module = FLASH_ATTENTION_MODULES.get(impl or "")
        if module is None or _importable(module):
            return impl
        _say_not_installed(impl, module)
        return None

    return impl_if_installed


@functools.cache
def _say_not_installed(impl: str, module: str) -> None:
    """Once a process, not once per attention layer."""
    log_rank_0(
        f"[torchtitan] {impl} ({module}) is not installed: varlen attention runs on "
        "torch's own kernels (cuDNN or FlashAttention 2)"
    )


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


def _no_lspci(ctx: PatchContext) -> bool:
    """lspci is not installed"""
    import shutil

    return shutil.which("lspci") is None


@register_patch(
    "torchtitan.peak_flops_without_lspci",
    backend="torchtitan",
    phase="setup",
    condition=_no_lspci,
    backend_versions=TESTED,
    target="torchtitan.tools.utils.get_peak_flops",
    tags=("device",),
)
def peak_flops_without_lspci(ctx: PatchContext) -> None:
    """TorchTitan looks its GPU's peak up by lspci's output, else by the device's name, and
    warns "Error running lspci" at each start where lspci is missing (containers, CPUs): the
    lookup by name stays, the warning goes (Primus computes MFU with its own peak)."""
    ctx.wrap("torchtitan.tools.utils", "get_peak_flops", _unwarned)


def _unwarned(original: Callable[[str], float]) -> Callable[[str], float]:
    def get_peak_flops(device_name: str) -> float:
        from torchtitan.tools.utils import logger

        logger.disabled, before = True, logger.disabled
        try:
            return original(device_name)
        finally:
            logger.disabled = before

    return get_peak_flops
