"""A full disk during a save: one message naming the checkpoint folder and the free space on
its file system, exit 1 (primus.core.errors.FileSystemError). Megatron's checkpoint writer
passes on only the type of the error that stopped it, so the folder's file system is asked:
a write there that it refuses now (full, over quota, read-only) is the reason. The tracker
still names the last complete checkpoint, which the same command resumes from."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from primus.core.errors import refused_writes
from primus.core.patches import TESTED, PatchContext, register_patch


def _named_folder(original: Callable[..., Any]) -> Callable[..., Any]:
    def save_checkpoint(iteration: int, *args: Any, **kwargs: Any) -> Any:
        from megatron.training.global_vars import get_args

        with refused_writes(Path(get_args().save) / f"iter_{iteration:07d}"):
            return original(iteration, *args, **kwargs)

    return save_checkpoint


@register_patch(
    "megatron.refused_writes",
    backend="megatron",
    phase="before_train",
    backend_versions=TESTED,
    target="megatron.training.checkpointing.save_checkpoint",
    tags=("reliability",),
)
def refused_checkpoint_writes(ctx: PatchContext) -> None:
    """A save stopped by a full, over-quota or read-only file system ends the run with one
    message naming its iter_N folder and the free space there."""
    ctx.wrap("megatron.training.checkpointing", "save_checkpoint", _named_folder)
