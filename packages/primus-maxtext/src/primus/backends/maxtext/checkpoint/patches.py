"""A resume from a checkpoint of another model (the same run directory after a change to the
model's shape) is one config error, not orbax's error, whose text lists every tensor of the
state it expected; one from a checkpoint whose files are damaged says so."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from primus.backends.maxtext.maxtext_adapter import TESTED
from primus.core.errors import ConfigError
from primus.core.patches import PatchContext, register_patch

SAID = 300  # characters of orbax's message kept in the error (it can run to megabytes)


def _another_model_refused(original: Callable[..., Any]) -> Callable[..., Any]:
    def load_state_if_possible(manager: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return original(manager, *args, **kwargs)
        except Exception as exc:  # orbax's NoEntryError, or a ValueError about shapes
            from maxtext.common.checkpointing import latest_step
            from primus.core.checkpoint.dcp import damage, damaged

            step = latest_step(manager) if manager is not None else None
            if step is not None and (cause := damage(exc)) is not None:
                raise damaged(f"{manager.directory}/{step}", cause) from None
            if step is None or not _mismatch(exc):
                raise
            said = "" if type(exc).__name__ == "NoEntryError" else f": {_first_line(exc)}"
            raise ConfigError(
                f"the checkpoint {manager.directory}/{step} does not fit this run's model (a "
                f"checkpoint of another model?): orbax cannot restore it{said}",
                hint="resume with the model it was saved with, or train another run "
                "(another exp_name)",
            ) from None

    return load_state_if_possible


def _first_line(exc: Exception) -> str:
    line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return line if len(line) <= SAID else line[:SAID] + " ..."


def _mismatch(exc: Exception) -> bool:
    """orbax's failure to restore a state whose tree or shapes are not the checkpoint's."""
    text = str(exc)[:2000].lower()
    return type(exc).__name__ == "NoEntryError" or (
        isinstance(exc, ValueError) and ("shape" in text or "structure" in text)
    )


@register_patch(
    "maxtext.another_model_refused",
    backend="maxtext",
    phase="setup",
    backend_versions=TESTED,
    target="maxtext.common.checkpointing.load_state_if_possible",
    tags=("reliability",),
)
def another_model_refused(ctx: PatchContext) -> None:
    """A resume whose checkpoint does not fit the run's model (orbax cannot restore its tree
    or shapes) is a config error naming the checkpoint, with orbax's first line cut short (its
    message lists every tensor of the state: megabytes), not orbax's traceback; one whose files
    are damaged (tensorstore's OUT_OF_RANGE, DATA_LOSS) is an error naming it, with the way
    back to the checkpoint before it."""
    ctx.wrap("maxtext.common.checkpointing", "load_state_if_possible", _another_model_refused)
