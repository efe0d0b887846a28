"""Non-finite numbers: a step whose loss or gradient norm is NaN/Inf skips Megatron's optimizer
step (weights, optimizer state and learning-rate schedule keep their values; Megatron counts it
as a skipped iteration); `max_skipped_steps` such steps in a row save the last good state and
stop the run with exit code 1 (primus.core.reliability.nonfinite)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from primus.core.patches import TESTED, PatchContext, register_patch
from primus.core.reliability.nonfinite import SkippedSteps


@register_patch(
    "megatron.nonfinite_args",
    backend="megatron",
    phase="setup",
    target="megatron args: check_for_nan_in_loss_and_grad",
    tags=("reliability",),
)
def nonfinite_args(ctx: PatchContext) -> None:
    """Megatron's own NaN checks (loss, gradients) raise, or rerun the step and exit: off, so
    that max_skipped_steps decides (megatron.skip_nonfinite)."""
    ctx.set_param(
        "check_for_nan_in_loss_and_grad",
        False,
        "a NaN/Inf loss or gradient norm skips the step, max_skipped_steps in a row stop the "
        "run (megatron.skip_nonfinite)",
    )


class GuardedOptimizer:
    """Megatron's optimizer for one `train_step`: `step()` first looks at the step's loss and
    gradient norm, over all ranks, and skips the update when either is not finite."""

    def __init__(self, optimizer: Any, model: list[Any], losses: list[dict], ok: Callable) -> None:
        self._optimizer, self._model, self._losses, self._ok = optimizer, model, losses, ok

    def __getattr__(self, name: str) -> Any:
        return getattr(self._optimizer, name)

    def _loss_and_grad_norm(self) -> tuple[float | None, float]:
        """The mean loss of the global batch and the norm of every rank's gradients (NaN or
        Inf if any rank's is: only finiteness is looked at), in one all-reduce."""
        import torch

        grads = [
            g
            for chunk in self._model
            for p in chunk.parameters()
            if (g := getattr(p, "main_grad", p.grad)) is not None
        ]
        squares = torch.stack(torch._foreach_norm(grads)).double().square().sum() if grads else 0
        sums = torch.zeros(3, dtype=torch.float64, device="cuda")
        for micro_batch in self._losses:  # [sum, tokens] per micro-batch, on the last stage
            sums[:2] += micro_batch["lm loss"].view(-1).double()
        sums[2] += squares
        if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
            torch.distributed.all_reduce(sums)
        loss_sum, tokens, grad_squares = sums.tolist()
        return (loss_sum / tokens if tokens else None), math.sqrt(grad_squares)

    def step(self) -> tuple[bool, Any, Any]:
        from megatron.training import get_args

        loss, grad_norm = self._loss_and_grad_norm()
        # fp16: overflowing gradients are the loss scaler's business (Megatron's optimizer
        # skips the step and lowers the scale); the loss still counts.
        values = {"loss": loss, "grad norm": None if get_args().fp16 else grad_norm}
        if not self._ok(values):
            return False, None, None  # what Megatron's optimizer returns when it skips
        return self._optimizer.step()


def _skip_nonfinite(guard: SkippedSteps) -> Callable[[Callable], Callable]:
    def wrapper(original: Callable) -> Callable:
        def train_step(
            forward_step_func: Any, data_iterator: Any, model: list[Any], optimizer: Any,
            scheduler: Any, config: Any, forward_backward_func: Callable, iteration: int,
            **kwargs: Any,
        ) -> Any:  # fmt: skip
            losses: list[dict] = []

            def forward_backward(**kw: Any) -> Any:
                losses[:] = forward_backward_func(**kw) or []
                return losses

            guarded = GuardedOptimizer(
                optimizer, model, losses, lambda values: guard.observe(iteration + 1, values)
            )
            return original(
                forward_step_func, data_iterator, model, guarded, scheduler, config,
                forward_backward, iteration=iteration, **kwargs,
            )  # fmt: skip

        return train_step

    return wrapper


def _stop_when_exhausted(ctx: PatchContext, guard: SkippedSteps) -> Callable[[Callable], Callable]:
    run_dir = ctx.run_dir
    assert run_dir is not None, "the runtime always sets the run directory"

    def wrapper(original: Callable) -> Callable:
        def checkpoint_and_decide_exit(*save_args: Any) -> bool:
            from primus.backends.megatron.reliability.stopping import save_now

            if guard.exhausted:  # the weights are the last good step's: the skipped kept them
                raise guard.error(str(save_now(run_dir, save_args)))  # type: ignore[arg-type]
            return original(*save_args)

        return checkpoint_and_decide_exit

    return wrapper


@register_patch(
    "megatron.skip_nonfinite",
    backend="megatron",
    phase="before_train",
    requires="megatron.nonfinite_args",
    backend_versions=TESTED,
    target="megatron.training.training.train_step, checkpoint_and_decide_exit",
    tags=("reliability",),
)
def skip_nonfinite(ctx: PatchContext) -> None:
    """Before each optimizer step: a NaN/Inf loss or gradient norm (on any rank) skips the
    update, logged with the step; at max_skipped_steps in a row, a checkpoint and exit 1."""
    guard = SkippedSteps.from_params(ctx)
    training = "megatron.training.training"
    ctx.wrap(training, "train_step", _skip_nonfinite(guard))
    ctx.wrap(training, "checkpoint_and_decide_exit", _stop_when_exhausted(ctx, guard))
