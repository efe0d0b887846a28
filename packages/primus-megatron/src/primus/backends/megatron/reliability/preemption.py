"""Preemption: SIGTERM, SIGINT or SIGUSR1 ends the run after the current step with Megatron's
checkpoint of that step and exit code 75 (primus.core.reliability.preemption); the same command resumes from
it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from primus.core.patches import TESTED, PatchContext, get_param, register_patch
from primus.core.reliability import preemption


def _megatron_handler_on(ctx: PatchContext) -> bool:
    """exit_signal_handler is true"""
    return bool(get_param(ctx, "exit_signal_handler", False))


@register_patch(
    "megatron.exit_signal_handler_off",
    backend="megatron",
    phase="setup",
    condition=_megatron_handler_on,
    target="megatron args: exit_signal_handler",
    tags=("reliability",),
)
def exit_signal_handler_off(ctx: PatchContext) -> None:
    """Leave SIGTERM to Primus: Megatron's handler would replace Primus's, save only when `save`
    is set and exit 0 on one signal (exit_signal); megatron.preemption covers it."""
    ctx.set_param(
        "exit_signal_handler",
        False,
        "Primus handles SIGTERM and SIGUSR1 on every rank (megatron.preemption: checkpoint, "
        "exit 75)",
    )


def _stop_on_signal(ctx: PatchContext) -> Callable[[Callable], Callable]:
    run_dir = ctx.run_dir
    assert run_dir is not None, "the runtime always sets the run directory"

    def wrapper(original: Callable) -> Callable:
        def checkpoint_and_decide_exit(*save_args: Any) -> bool:
            import torch

            from primus.backends.megatron.reliability.stopping import agreed_max, save_now

            if not preemption.agreed(lambda number: agreed_max(number)[0]):
                return original(*save_args)
            saved = save_now(run_dir, save_args)  # type: ignore[arg-type]
            preemption.stop(run_dir, save_args[3], saved, torch.distributed.get_rank())

        return checkpoint_and_decide_exit

    return wrapper


@register_patch(
    "megatron.preemption",
    backend="megatron",
    phase="before_train",
    backend_versions=TESTED,
    target="megatron.training.training.checkpoint_and_decide_exit",
    tags=("reliability",),
)
def stop_on_preemption(ctx: PatchContext) -> None:
    """After each step, when any rank got SIGTERM/SIGINT/SIGUSR1 (all ranks agree): Megatron's
    checkpoint of the step, then exit 75 with how to resume (the next run loads it)."""
    ctx.wrap("megatron.training.training", "checkpoint_and_decide_exit", _stop_on_signal(ctx))
