"""Crash-safe checkpoints: DCP writes a save's `.metadata` last (to `.metadata.tmp`, then a
rename), and TorchTitan resumes only from `step-N` folders that have one; a resume says which
folders it passed over as incomplete."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from primus.core.logging import log_rank_0
from primus.core.patches import TESTED, PatchContext, register_patch


def incomplete(folder: str, chosen: int) -> list[str]:
    """The `step-N` folders in `folder` newer than `chosen`, the latest complete save: saves
    that did not finish."""
    from torchtitan.tools import filesystem

    found = []
    for name in filesystem.listdir(folder) if filesystem.isdir(folder) else ():
        match = re.fullmatch(r"step-(\d+)", name)
        if match and int(match.group(1)) > chosen:
            found.append((int(match.group(1)), name))
    return [name for _, name in sorted(found)]


@register_patch(
    "torchtitan.checkpoint_choice",
    backend="torchtitan",
    phase="build_args",
    backend_versions=TESTED,
    target="torchtitan.components.checkpointer.CheckpointManager._find_load_step",
    tags=("reliability",),
)
def checkpoint_choice(ctx: PatchContext) -> None:
    """A resume names the step-N folders newer than the one it loads (a save that did not
    finish: no .metadata) and says which one it resumes from."""

    def wrapper(original: Callable[..., int]) -> Callable[..., int]:
        def find_load_step(self: Any, folder: str = "") -> int:
            step = original(self, folder)
            skipped = incomplete(folder or self.folder, step)
            if skipped:
                chosen = f"step-{step}" if step >= 0 else "none (a fresh start)"
                log_rank_0(f"[torchtitan] checkpoint: {', '.join(skipped)} incomplete (no "
                           f".metadata: the save did not finish), skipped; the latest complete "
                           f"one: {chosen}")  # fmt: skip
            return step

        return find_load_step

    ctx.wrap("torchtitan.components.checkpointer.CheckpointManager", "_find_load_step", wrapper)
