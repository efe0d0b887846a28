"""Where Megatron runs: on the GPU as upstream intends, or on the CPU with gloo."""

from __future__ import annotations

from primus.core.devices import gpu_visible, wants_cpu
from primus.core.logging import log_rank_0
from primus.core.patches import TESTED, PatchContext, get_args, get_param, register_patch


@register_patch(
    "megatron.cpu",
    backend="megatron",
    phase="setup",
    condition=wants_cpu,
    backend_versions=TESTED,
    target="torch.cuda, torch.distributed.init_process_group",
    tags=("device",),
)
def cpu(ctx: PatchContext) -> None:
    """Answer megatron.training's CUDA calls on the CPU and use gloo (tests, laptops, CI)."""
    from primus.backends.megatron.devices import cpu as shims

    for change in shims.enable(ctx):
        log_rank_0(f"[megatron] cpu: {change}")


PRE_BLACKWELL = 9  # the compute capability Megatron's argument checks assume with no GPU here


def _gpu_job_built_without_gpu(ctx: PatchContext) -> bool:
    """a GPU job whose args are built where no GPU is visible (a dry run or a projection)"""
    return not wants_cpu(ctx) and not gpu_visible()


@register_patch(
    "megatron.build_without_gpu",
    backend="megatron",
    phase="setup",
    condition=_gpu_job_built_without_gpu,
    backend_versions=TESTED,
    target="megatron.training.arguments.get_device_arch_version",
    tags=("device",),
)
def build_without_gpu(ctx: PatchContext) -> None:
    """Megatron's argument checks ask the GPU's architecture (with tensor or context parallel):
    where there is none, they assume a pre-Blackwell one, the stricter checks, instead of
    failing in CUDA's initialisation."""
    import megatron.training.arguments as arguments

    ctx.replace(arguments, "get_device_arch_version", lambda: PRE_BLACKWELL)
    log_rank_0(f"[megatron] no GPU here: argument checks assume compute capability {PRE_BLACKWELL}")


@register_patch(
    "megatron.cpu_args",
    backend="megatron",
    phase="build_args",
    requires="megatron.cpu",
    backend_versions=TESTED,
    target="megatron args, megatron.core.tensor_parallel.random (CUDA RNG state)",
    tags=("device",),
)
def cpu_args(ctx: PatchContext) -> None:
    """CPU initialization, gloo, CUDA-only fusions off, the RNG tracker on the CPU generator."""
    from primus.backends.megatron.devices import cpu as shims

    for change in shims.cpu_args(ctx, get_args(ctx)):
        log_rank_0(f"[megatron] cpu: {change}")


def _needs_one_connection(ctx: PatchContext) -> bool:
    """tensor or context parallel > 1 and CUDA_DEVICE_MAX_CONNECTIONS is unset"""
    import os

    parallel = max(
        get_param(ctx, "tensor_model_parallel_size", 1) or 1,
        get_param(ctx, "context_parallel_size", 1) or 1,
    )
    return parallel > 1 and "CUDA_DEVICE_MAX_CONNECTIONS" not in os.environ


@register_patch(
    "megatron.cuda_device_max_connections",
    backend="megatron",
    phase="setup",
    condition=_needs_one_connection,
    target="env CUDA_DEVICE_MAX_CONNECTIONS",
    tags=("device",),
)
def cuda_device_max_connections(ctx: PatchContext) -> None:
    """Set CUDA_DEVICE_MAX_CONNECTIONS=1, which Megatron requires with TP or CP (it orders the
    communication kernels before the GEMMs that depend on them)."""
    import os

    os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"
    log_rank_0("[megatron] CUDA_DEVICE_MAX_CONNECTIONS=1 (tensor/context parallel)")
