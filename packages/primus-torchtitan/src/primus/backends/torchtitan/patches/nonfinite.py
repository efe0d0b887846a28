"""Non-finite numbers: a step whose loss or gradient norm is NaN/Inf on any rank is skipped
before the optimizer step; `max_skipped_steps` in a row stop the run (primus.core.nonfinite)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from primus.core.nonfinite import SkippedSteps
from primus.core.patches import TESTED, PatchContext, register_patch


class _Skip(Exception):
    """Raised at the gradient norm of a non-finite step: no optimizer or lr scheduler step."""


@dataclass
class StepCheck:
    """The step being trained (None outside `train_step`) and the sum of its losses so far
    (a new tensor per microbatch group: a CUDA graph's output buffer is reused)."""

    guard: SkippedSteps
    step: int | None = None
    loss: Any = 0.0

    def update_allowed(self, grad_norm: Any) -> bool:
        """Whether the step's loss and gradient norm are finite on every rank (a sum over the
        ranks is non-finite when any term is); logs a skip."""
        from primus.backends.torchtitan.resilience import across_ranks

        assert self.step is not None
        total_loss, total_norm = across_ranks([self.loss, grad_norm.detach().float()], "sum")
        return self.guard.observe(self.step, {"loss": total_loss, "grad norm": total_norm})


@register_patch(
    "torchtitan.nonfinite",
    backend="torchtitan",
    phase="before_train",
    backend_versions=TESTED,
    target="Trainer.train_step, Trainer.forward_backward_step, "
    "torchtitan.distributed.utils.clip_grad_norm_",
    tags=("reliability",),
)
def skip_nonfinite(ctx: PatchContext) -> None:
    """Before the optimizer step (at the gradient norm TorchTitan computes for clipping), a NaN
    or Inf loss or gradient norm skips the step: no optimizer or lr scheduler update, no step
    line, a warning with the step number. The `max_skipped_steps`-th in a row writes a full
    checkpoint of the last good state (as `step-N` of the current step, so a resume goes on
    with the data after the skipped steps) and stops the run with exit 1."""
    from primus.backends.torchtitan.resilience import save_full

    check = StepCheck(SkippedSteps.from_params(ctx))
    trainer = type(ctx.extra["trainer"].trainer)

    def with_check(original: Callable[..., Any]) -> Callable[..., Any]:
        def train_step(self: Any, data_iterator: Any) -> Any:
            check.step, check.loss = self.step, 0.0
            try:
                return original(self, data_iterator)
            except _Skip:
                if check.guard.exhausted:
                    raise check.guard.error(save_full(self.checkpointer, self.step)) from None
                return None
            finally:
                check.step = None

        return train_step

    def keep_loss(original: Callable[..., Any]) -> Callable[..., Any]:
        def forward_backward_step(self: Any, **kwargs: Any) -> Any:
            loss = original(self, **kwargs)
            if check.step is not None:
                check.loss = check.loss + loss.detach().float().sum()
            return loss

        return forward_backward_step

    def checked(original: Callable[..., Any]) -> Callable[..., Any]:
        def clip_grad_norm_(*args: Any, **kwargs: Any) -> Any:
            norm = original(*args, **kwargs)
            if check.step is not None and not check.update_allowed(norm):
                raise _Skip
            return norm

        return clip_grad_norm_

    ctx.wrap(trainer, "train_step", with_check)
    ctx.wrap(trainer, "forward_backward_step", keep_loss)
    ctx.wrap("torchtitan.distributed.utils", "clip_grad_norm_", checked)
