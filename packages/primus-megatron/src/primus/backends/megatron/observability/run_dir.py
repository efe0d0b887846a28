"""Outputs go into the run directory: checkpoints, tensorboard, wandb."""

from __future__ import annotations

import importlib.util

from primus.core.logging import log_rank_0
from primus.core.patches import PatchContext, get_args, register_patch


@register_patch(
    "megatron.run_dir",
    backend="megatron",
    phase="build_args",
    target="megatron args: save, load, tensorboard_dir, wandb_save_dir",
    tags=("io",),
)
def run_dir(ctx: PatchContext) -> None:
    """Checkpoints (when save_interval is set), tensorboard (when installed) and wandb into the run directory;
    `load` defaults to `save`, so running the experiment again resumes it (or, with
    `init_from` or once `primus checkpoint import` filled it, to the run directory's
    checkpoints folder, where the HF import goes)."""
    args, routed = get_args(ctx), []
    assert ctx.run_dir is not None, "the runtime always sets the run directory"
    if args.save is None and args.save_interval:
        args.save = str(ctx.run_dir / "checkpoints")
        routed.append(f"save={args.save}")
    if args.load is None and args.save is not None:
        args.load = args.save
        routed.append("load=save (resumes from the latest checkpoint there)")
    module = ctx.extra.get("module")
    imported = (ctx.run_dir / "checkpoints").is_dir()
    if args.load is None and (imported or (module is not None and module.init_from is not None)):
        args.load = str(ctx.run_dir / "checkpoints")
        routed.append(f"load={args.load} (where the HF import goes)")
    if args.tensorboard_dir is None and importlib.util.find_spec("tensorboard") is not None:
        args.tensorboard_dir = str(ctx.run_dir / "tensorboard")
        routed.append(f"tensorboard_dir={args.tensorboard_dir}")
    elif args.tensorboard_dir is None:
        routed.append("no tensorboard logs: the tensorboard package is not installed")
    if args.wandb_project and not args.wandb_save_dir:
        args.wandb_save_dir = str(ctx.run_dir / "wandb")
        routed.append(f"wandb_save_dir={args.wandb_save_dir}")
    for item in routed:
        log_rank_0(f"[megatron] {item}")
