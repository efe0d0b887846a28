"""A full disk during a save: one message naming the step-N folder and the free space on its
file system, exit 1 (primus.core.errors.FileSystemError). DCP reports each rank's failure
inside a CheckpointException, and torch.save's zip writer turns ENOSPC into a RuntimeError
with the OSError only as its context and no file name: the folder comes from here. The folder
has no .metadata, so the same command resumes from the last complete step."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from primus.core.errors import refused_writes
from primus.core.patches import TESTED, PatchContext, register_patch


def _named_folder(original: Callable[..., Any]) -> Callable[..., Any]:
    def dcp_save(self: Any, state_dict: dict, checkpoint_id: str, *args: Any, **kw: Any) -> Any:
        with refused_writes(checkpoint_id):
            return original(self, state_dict, checkpoint_id, *args, **kw)

    return dcp_save


@register_patch(
    "torchtitan.refused_writes",
    backend="torchtitan",
    phase="build_args",
    backend_versions=TESTED,
    target="torchtitan.components.checkpointer.CheckpointManager.dcp_save",
    tags=("reliability",),
)
def refused_checkpoint_writes(ctx: PatchContext) -> None:
    """A save stopped by a full, over-quota or read-only file system ends the run with one
    message naming its step-N folder and the free space there."""
    ctx.wrap("torchtitan.components.checkpointer.CheckpointManager", "dcp_save", _named_folder)
