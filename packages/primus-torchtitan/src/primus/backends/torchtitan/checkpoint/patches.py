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

from primus.core.errors import ConfigError, PrimusError
from primus.core.logging import log_rank_0
from primus.core.patches import TESTED, PatchContext, register_patch


def _steps(folder: str) -> list[int]:
    """The N of the `step-N` folders in `folder`, in increasing order."""
    from torchtitan.tools import filesystem

    names = filesystem.listdir(folder) if filesystem.isdir(folder) else ()
    return sorted(int(m.group(1)) for n in names if (m := re.fullmatch(r"step-(\d+)", n)))


def incomplete(folder: str, chosen: int) -> list[str]:
    """The `step-N` folders in `folder` newer than `chosen`, the latest complete save: saves
    that did not finish."""
    return [f"step-{n}" for n in _steps(folder) if n > chosen]


def resumable(checkpoint: str) -> bool:
    """Whether a step folder holds a save a run resumes from (DCP with the train state), not
    the model-only or HF export TorchTitan writes at the last step (checkpoint.
    last_save_model_only, last_save_in_hf), which it would otherwise pick and fail to load. A
    remote folder is taken as TorchTitan takes it. A `.metadata` that cannot be read (cut
    short, overwritten) is the error naming the folder (`damaged`)."""
    if "://" in checkpoint:
        return True
    from primus.core.checkpoint.dcp import read_metadata

    metadata = read_metadata(checkpoint)
    return metadata is not None and any(
        key.split(".")[0] == "train_state" for key in metadata.state_dict_metadata
    )


# what TorchTitan takes as a save in a step folder: DCP's, or an HF export's index
SAVED = (".metadata", "model.safetensors.index.json")


def _resumed_step(folder: str, latest: int) -> tuple[int, list[str]]:
    """The newest step at or before `latest` (TorchTitan's pick) a run resumes from, and the
    exports passed over (saves, DCP or HF, that hold the model only). Step 0 is TorchTitan's
    seed checkpoint, model only by design: taken as it is."""
    exports: list[str] = []
    for step in reversed([n for n in _steps(folder) if 0 <= n <= latest]):
        path = os.path.join(folder, f"step-{step}")
        if step == 0 or resumable(path):
            return step, exports
        if any(os.path.isfile(os.path.join(path, name)) for name in SAVED):
            exports.append(f"step-{step}")
    return -1, exports


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
    loads (saves that did not finish) and says which one it resumes from, passing over the last
    step's model-only or HF export; a checkpoint of another model (DCP's missing key or size
    mismatch) is one config error, not a traceback."""

    def wrapper(original: Callable[..., int]) -> Callable[..., int]:
        def find_load_step(self: Any, folder: str = "") -> int:
            folder = folder or self.folder
            step, exports = _resumed_step(folder, original(self, folder))
            if exports:
                verb = "holds" if len(exports) == 1 else "hold"
                log_rank_0(f"[torchtitan] checkpoint: {', '.join(exports)} {verb} the model only "
                           "(the last step's export), not a run to resume: skipped")  # fmt: skip
            skipped = [name for name in incomplete(folder, step) if name not in exports]
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

        from primus.core.checkpoint.dcp import damage, damaged, read_metadata

        initial = _from_initial_load(self, step)
        if initial:
            read_metadata(self.initial_load_path)  # a damaged one is refused before DCP logs it
        try:
            return original(self, step)
        except PrimusError:  # a step folder's .metadata damaged (`resumable`): said already
            raise
        except (Exception, CheckpointException) as exc:  # the latter is a BaseException
            if (cause := damage(exc)) is not None:
                raise damaged(_loading(self, step), cause) from exc
            other = isinstance(exc, RuntimeError | CheckpointException)
            said = _other_model(str(exc)) if other else None
            if said is None:
                raise
            if initial:
                raise ConfigError(
                    f"checkpoint.initial_load_path {self.initial_load_path} holds another "
                    f"model: {said}",
                    hint="name a checkpoint of this model, or set the model preset it was "
                    "saved with",
                ) from None
            raise ConfigError(
                f"the checkpoint in {self.folder} was saved by another model: {said}",
                hint="resume with the model it was saved with, or train another run "
                "(another exp_name)",
            ) from None

    return load


def _from_initial_load(manager: Any, step: int) -> bool:
    """Whether `CheckpointManager.load(step)` read checkpoint.initial_load_path: no step asked
    for, and no save in the run's checkpoint folder to resume from."""
    if step != -1 or not getattr(manager, "initial_load_path", None):  # none when disabled
        return False
    latest = max(_steps(manager.folder), default=-1)
    return latest < 0 or _resumed_step(manager.folder, latest)[0] < 0


def _loading(manager: Any, step: int) -> str:
    """The folder `CheckpointManager.load(step)` reads: checkpoint.initial_load_path, the
    step asked for, or the latest complete save a run resumes from."""
    if _from_initial_load(manager, step):
        return str(manager.initial_load_path)
    if step == -1:
        saved = [n for n in _steps(manager.folder)
                 if os.path.isfile(os.path.join(manager.folder, f"step-{n}", ".metadata"))]  # fmt: skip
        step = _resumed_step(manager.folder, max(saved, default=-1))[0]
    return os.path.join(manager.folder, f"step-{step}")
