"""Crash-safe checkpoints: DCP writes a save's `.metadata` last (to `.metadata.tmp`, then a
rename), and TorchTitan resumes only from `step-N` folders that have one. Primus adds: a save
into a folder that holds a complete checkpoint already removes its `.metadata` first (else a
kill during the save would leave the old `.metadata` over partly new files), and a resume says
which folders it passed over as incomplete, and a checkpoint of another model is refused with
one message (not DCP's traceback)."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import Any

from primus.core.errors import ConfigError
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


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_initialized() else 0


@register_patch(
    "torchtitan.crash_safe_checkpoints",
    backend="torchtitan",
    phase="build_args",
    backend_versions=TESTED,
    target="torchtitan.components.checkpointer.CheckpointManager._find_load_step, dcp_save, load",
    tags=("reliability",),
)
def crash_safe_checkpoints(ctx: PatchContext) -> None:
    """A save into a local step-N folder with a complete checkpoint (a run resumed from an
    earlier checkpoint.load_step) first removes its .metadata, so the folder counts as incomplete
    until the new save is done; a resume names the step-N folders newer than the one it
    loads (saves that did not finish) and says which one it resumes from; a checkpoint of
    another model (DCP's missing key or size mismatch) is one config error, not a traceback."""

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

    def incomplete_until_done(original: Callable[..., Any]) -> Callable[..., Any]:
        def dcp_save(self: Any, state_dict: dict, checkpoint_id: str, *args: Any, **kw: Any) -> Any:
            metadata = os.path.join(checkpoint_id, ".metadata")  # a local folder (not fsspec)
            if _rank() == 0 and os.path.isfile(metadata):  # before DCP's first collective,
                os.remove(metadata)  # so before any rank writes into the folder
                log_rank_0(f"[torchtitan] checkpoint: {checkpoint_id} is written again; its "
                           ".metadata removed until the new save is complete")  # fmt: skip
            return original(self, state_dict, checkpoint_id, *args, **kw)

        return dcp_save

    manager = "torchtitan.components.checkpointer.CheckpointManager"
    ctx.wrap(manager, "_find_load_step", wrapper)
    ctx.wrap(manager, "dcp_save", incomplete_until_done)
    ctx.wrap(manager, "load", _another_model_refused)


# what DCP says when the checkpoint's tensors are not the model's
OTHER_MODEL = ("Missing key in checkpoint state_dict", "Size mismatch", "size mismatch")


def _other_model(text: str) -> str | None:
    """DCP's line that says the checkpoint's tensors are not the model's (the error itself, not
    the traceback lines DCP folds into a rank's failure), or None."""
    for line in text.splitlines():
        line = line.strip()
        if any(marker in line for marker in OTHER_MODEL) and not line.startswith("raise "):
            return line.split(": ", 1)[1] if line.split(":", 1)[0].endswith("Error") else line
    return None


def _another_model_refused(original: Callable[..., bool]) -> Callable[..., bool]:
    def load(self: Any, step: int = -1) -> bool:
        from torch.distributed.checkpoint.api import CheckpointException

        try:
            return original(self, step)
        except (RuntimeError, CheckpointException) as exc:
            said = _other_model(str(exc))
            if said is None:
                raise
            raise ConfigError(
                f"the checkpoint in {self.folder} was saved by another model: {said}",
                hint="resume with the model it was saved with, or train another run "
                "(another exp_name)",
            ) from None

    return load
