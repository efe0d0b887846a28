"""Preemption: SIGTERM, SIGINT or SIGUSR1 ends a MaxText run after the current step with a
checkpoint (exit 75); running the same command again resumes from it (primus.core.reliability.preemption)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from primus.backends.maxtext.maxtext_adapter import TESTED
from primus.backends.maxtext.reliability.stopping import (
    NO_CHECKPOINT,
    TRAIN,
    largest,
    save_step,
)
from primus.core.errors import PrimusError
from primus.core.patches import PatchContext, register_patch
from primus.core.reliability import preemption


@register_patch(
    "maxtext.preemption",
    backend="maxtext",
    phase="before_train",
    backend_versions=TESTED,
    target=f"{TRAIN}.training_loop_iteration",
    tags=("reliability",),
)
def stop_on_preemption(ctx: PatchContext) -> None:
    """After each training step, a stop signal (SIGTERM/SIGINT/SIGUSR1) that reached any
    process saves that step through MaxText's orbax checkpointing (the grain position with it),
    waits until it is complete and stops the run with exit code 75; the same command resumes from
    it."""
    assert ctx.run_dir is not None, "the runtime always sets the run directory"
    run_dir = ctx.run_dir

    def wrapper(original: Callable[..., Any]) -> Callable[..., Any]:
        watching: list[bool] = []

        def training_loop_iteration(
            jax_device_state: dict[str, Any], python_vars: dict[str, Any], immutable_data: dict
        ) -> Any:
            if not watching:  # JAX's runtime, orbax or grain may have set their own handlers
                preemption.watch()
                watching.append(True)
            metrics = original(jax_device_state, python_vars, immutable_data)
            if preemption.agreed(largest):
                import jax

                step = python_vars["step"] + 1  # MaxText counts from 0, Primus's logs from 1
                saved = save_step(jax_device_state, python_vars, immutable_data["config"])
                if saved == NO_CHECKPOINT:
                    raise PrimusError(
                        f"{preemption.requested() or 'a preemption signal'} at step {step}: "
                        f"stopped with {saved}; the run cannot resume",
                        hint="set enable_checkpointing: true for runs that may be preempted",
                    )
                preemption.stop(run_dir, step, saved, jax.process_index())
            return metrics

        return training_loop_iteration

    ctx.wrap(TRAIN, "training_loop_iteration", wrapper)
