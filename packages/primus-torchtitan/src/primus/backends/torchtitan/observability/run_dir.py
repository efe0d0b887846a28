"""Outputs go into the run directory: TorchTitan's dump folder, so checkpoints and tensorboard."""

from __future__ import annotations

import os

from primus.core.logging import log_rank_0
from primus.core.patches import PatchContext, get_args, register_patch

DEFAULT_DUMP_FOLDER = "./outputs"  # Trainer.Config's default


@register_patch(
    "torchtitan.run_dir",
    backend="torchtitan",
    phase="build_args",
    target="Trainer.Config.dump_folder",
    tags=("io",),
)
def run_dir(ctx: PatchContext) -> None:
    """dump_folder (checkpoints, tensorboard, profiles) becomes the run directory unless set;
    with checkpoint.enable, running the experiment again resumes from the latest checkpoint."""
    config = get_args(ctx)
    assert ctx.run_dir is not None, "the runtime always sets the run directory"
    if config.dump_folder == DEFAULT_DUMP_FOLDER:
        config.dump_folder = str(ctx.run_dir)
    log_rank_0(f"[torchtitan] dump_folder={config.dump_folder}")
    if config.checkpoint.enable:
        folder = os.path.join(config.dump_folder, config.checkpoint.folder)
        log_rank_0(f"[torchtitan] checkpoints: {folder} (resumes from the latest one there)")
    if config.metrics.enable_tensorboard:
        log_rank_0(
            f"[torchtitan] tensorboard: {os.path.join(config.dump_folder, config.metrics.save_tb_folder)}"
        )
