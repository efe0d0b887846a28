"""Preemption: a SIGTERM, SIGINT or SIGUSR1 ends the run after the current step with a full
checkpoint of that step and exit code 75 (primus.core.reliability.preemption); running the same command
resumes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from primus.core.errors import PrimusError
from primus.core.logging import log_rank_0
from primus.core.patches import TESTED, PatchContext, register_patch
from primus.core.reliability import preemption


@register_patch(
    "torchtitan.preemption",
    backend="torchtitan",
    phase="before_train",
    backend_versions=TESTED,
    target="torchtitan.components.checkpointer.CheckpointManager.save",
    tags=("reliability",),
)
def stop_on_preemption(ctx: PatchContext) -> None:
    """After each step's checkpoint decision, the ranks agree on a preemption signal (any rank
    got one: all-reduce MAX, over gloo); then every rank writes a full checkpoint of the step
    (unless the step's own save was one), waits for async saves, and the run stops with exit 75."""
    from primus.backends.torchtitan.reliability.stopping import (
        across_ranks,
        host_group,
        rank,
        save_full,
    )

    run_dir = ctx.run_dir
    assert run_dir is not None, "the runtime always sets the run directory"
    checkpointer = ctx.extra["trainer"].trainer.checkpointer
    group = host_group()  # the flag is agreed on the host: no device sync at each step
    if not checkpointer.enable:
        log_rank_0("[torchtitan] preemption: checkpoint.enable is false, so a SIGTERM/SIGUSR1 "
                   "stops the run after its step without a checkpoint (exit 1)")  # fmt: skip
        preemption.stops_unsaved("checkpoint.enable is false")

    def wrapper(original: Callable[..., bool]) -> Callable[..., bool]:
        def save(self: Any, curr_step: int, last_step: bool = False) -> bool:
            saved = original(self, curr_step, last_step)
            if not preemption.agreed(lambda number: across_ranks([number], "max", group)[0]):
                return saved
            if last_step:
                log_rank_0(f"[torchtitan] preemption signal at the last step ({curr_step}): "
                           "the run is complete")  # fmt: skip
                return saved
            if not self.enable:
                raise PrimusError(
                    f"{preemption.requested() or 'a preemption signal'} at step {curr_step}: "
                    "stopped without a checkpoint (checkpoint.enable is false)",
                    hint="set checkpoint.enable: true so that a preempted run can resume",
                )
            if saved:  # the step's own save: full (not the last step's), maybe async
                self.maybe_wait_for_saving()
                path = str(self._create_checkpoint_id(curr_step))
            else:
                path = save_full(self, curr_step)
            preemption.stop(run_dir, curr_step, path, rank())

        return save

    ctx.wrap(type(checkpointer), "save", wrapper)
