"""Where JAX runs, and how its processes find each other (before JAX touches a device)."""

from __future__ import annotations

from primus.backends.maxtext.checkpoint.native import IMPORT_FOLDER
from primus.backends.maxtext.maxtext_adapter import TESTED
from primus.core.errors import ConfigError
from primus.core.launch.dist_env import get_torchrun_env
from primus.core.logging import log_rank_0
from primus.core.patches import PatchContext, get_param, register_patch


def _on_cpu(ctx: PatchContext) -> bool:
    """hardware is cpu"""
    return get_param(ctx, "hardware") == "cpu"


@register_patch(
    "maxtext.cpu",
    backend="maxtext",
    phase="setup",
    condition=_on_cpu,
    priority=5,
    backend_versions=TESTED,
    target="jax config jax_platforms",
    tags=("device",),
)
def cpu(ctx: PatchContext) -> None:
    """Run JAX on the CPU, as `hardware: cpu` asks, also where a GPU and JAX's CUDA plugin are
    installed (JAX would pick the GPU while MaxText plans for the CPU)."""
    import jax

    jax.config.update("jax_platforms", "cpu")
    log_rank_0("[maxtext] cpu: jax_platforms=cpu")


def _primus_starts_jax(ctx: PatchContext) -> bool:
    """skip_jax_distributed_system is not set"""
    return get_param(ctx, "skip_jax_distributed_system") is None


@register_patch(
    "maxtext.jax_distributed",
    backend="maxtext",
    phase="setup",
    condition=_primus_starts_jax,
    priority=10,
    backend_versions=TESTED,
    target="maxtext.utils.max_utils.maybe_initialize_jax_distributed_system",
    tags=("distributed",),
)
def jax_distributed(ctx: PatchContext) -> None:
    """Start JAX's distributed runtime from Primus's launch, not MaxText's start-up (XPK's
    variables, coordinator port 1234): coordinator MASTER_ADDR:MASTER_PORT, process RANK of
    WORLD_SIZE (torchrun's or Slurm's variables), one GPU per process where a node runs several.
    One process starts none. MaxText's own start-up is skipped (skip_jax_distributed_system)."""
    ctx.set_param("skip_jax_distributed_system", True, "Primus starts JAX's distributed runtime")
    env = get_torchrun_env()
    if env.world_size == 1:
        return
    module = ctx.extra.get("module")
    if module is not None and module.init_from is not None and ctx.run_dir is not None:
        imported = ctx.run_dir / (get_param(ctx, "run_name") or "") / IMPORT_FOLDER  # as run_dir
        if not imported.is_dir():  # orbax's save is a collective: import in one process
            raise ConfigError(
                f"init_from: MaxText cannot import while {env.world_size} processes run",
                module.init_from_origin,
                hint=f"import first, in one process: primus checkpoint import --hf "
                f"{module.init_from} --config <experiment>; then train (it starts from it)",
            )
    import jax

    gpu = get_param(ctx, "hardware") in ("gpu", "gpu_multiprocess")
    coordinator = f"{env.master_addr}:{env.master_port}"
    jax.distributed.initialize(
        coordinator_address=coordinator,
        num_processes=env.world_size,
        process_id=env.rank,
        local_device_ids=[env.local_rank] if gpu and env.local_world_size > 1 else None,
        initialization_timeout=get_param(ctx, "jax_distributed_initialization_timeout") or 300,
    )
    log_rank_0(f"[maxtext] JAX distributed: {env.world_size} processes, coordinator {coordinator}")
