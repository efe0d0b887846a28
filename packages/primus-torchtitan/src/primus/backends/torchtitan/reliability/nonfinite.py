"""Non-finite numbers: a step whose loss or gradient norm is NaN/Inf on any rank makes no
optimizer or lr scheduler update; `max_skipped_steps` in a row stop the run
(primus.core.reliability.nonfinite).

Two ways to decide, the same outcome:

- on the device, when every optimizer is a fused torch Adam/AdamW and no optimizer step hook
  is registered: the finite flag is reduced over the ranks on the device at the gradient norm,
  handed to the optimizers as `found_inf` (their fused kernel then leaves the weights, moments
  and step count as they were), and read on the host only once the optimizer step is enqueued,
  so the GPU does not idle between the backward and the optimizer step;
- on the host, otherwise (foreach or for-loop Adam, other optimizers, hooks that would run on
  a skipped step): the loss and gradient norm are summed over the ranks and read at the
  gradient norm, before the optimizer step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from primus.core.logging import get_logger
from primus.core.patches import TESTED, PatchContext, register_patch
from primus.core.reliability.nonfinite import SkippedSteps


class _Skip(Exception):
    """Raised for a non-finite step before the lr scheduler steps (on the host path, before the
    optimizer steps too): no step line, the skip is counted."""


def on_device(optimizers: Any) -> bool:
    """Whether the optimizers can skip a step on the device: each a torch Adam or AdamW with
    `fused=True` in every param group (the fused kernel honours `found_inf`), and no step
    pre/post hook on them or their container (it would still run on a skipped step)."""
    from torch.optim import Adam, AdamW
    from torch.optim import optimizer as torch_optimizer

    hooked = [*optimizers, optimizers]
    return (
        all(type(o) in (Adam, AdamW) and all(g.get("fused") for g in o.param_groups)
            for o in optimizers)
        and not any(getattr(o, "_optimizer_step_pre_hooks", None)
                    or getattr(o, "_optimizer_step_post_hooks", None) for o in hooked)
        and not torch_optimizer._global_optimizer_pre_hooks
        and not torch_optimizer._global_optimizer_post_hooks
    )  # fmt: skip


@dataclass
class StepCheck:
    """The step being trained (None outside `train_step`), the sum of its losses so far (a new
    tensor per microbatch group: a CUDA graph's output buffer is reused), and on the device
    path its gradient norm and `found_inf` (1.0 when the step is non-finite on any rank)."""

    guard: SkippedSteps
    step: int | None = None
    loss: Any = 0.0
    norm: Any = None
    found_inf: Any = None
    logged: bool = False

    def update_allowed(self, grad_norm: Any) -> bool:
        """Whether the step's loss and gradient norm are finite on every rank (a sum over the
        ranks is non-finite when any term is); logs a skip. A host sync."""
        from primus.backends.torchtitan.reliability.stopping import across_ranks

        assert self.step is not None
        total_loss, total_norm = across_ranks([self.loss, grad_norm.detach().float()], "sum")
        return self.guard.observe(self.step, {"loss": total_loss, "grad norm": total_norm})

    def flag(self, grad_norm: Any) -> None:
        """`found_inf`: 1.0 when the loss or gradient norm is non-finite on any rank, as a 0-d
        tensor on the norm's device, reduced over the default group without a host sync."""
        import torch
        import torch.distributed as dist

        norm = grad_norm.detach()
        ok = torch.isfinite(norm).all()
        if isinstance(self.loss, torch.Tensor):  # else 0.0: no copy of a host number
            ok = ok & torch.isfinite(self.loss.to(norm.device)).all()
        ok = ok.float()
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(ok, op=dist.ReduceOp.MIN)
        self.norm, self.found_inf = norm, 1.0 - ok

    def after_step(self) -> bool:
        """On the device path, once the optimizer step is enqueued: whether the step was
        finite (a host sync); a skip is logged with the ranks' summed values."""
        assert self.step is not None
        if not self.found_inf.item():
            return self.guard.observe(self.step, {})
        self.update_allowed(self.norm)
        return False


@register_patch(
    "torchtitan.nonfinite",
    backend="torchtitan",
    phase="before_train",
    backend_versions=TESTED,
    target="Trainer.train_step, Trainer.forward_backward_step, "
    "torchtitan.distributed.utils.clip_grad_norm_, Trainer.optimizers.step",
    tags=("reliability",),
)
def skip_nonfinite(ctx: PatchContext) -> None:
    """A NaN or Inf loss or gradient norm skips the step: no optimizer or lr scheduler update,
    no step line, a warning with the step number (decided on the device or the host: see the
    module). The `max_skipped_steps`-th in a row writes a full checkpoint of the last good
    state (as `step-N` of the current step, so a resume goes on with the data after the skipped
    steps) and stops the run with exit 1."""
    from primus.backends.torchtitan.reliability.stopping import save_full

    check = StepCheck(SkippedSteps.from_params(ctx))
    titan = ctx.extra["trainer"].trainer
    trainer = type(titan)

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
                check.step = check.norm = check.found_inf = None

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
            if check.step is None:
                return norm
            device = on_device(titan.optimizers)
            if not check.logged:
                check.logged = True
                where = (
                    "device (fused Adam's found_inf)" if device else "host, at the gradient norm"
                )
                get_logger().info(f"non-finite steps: decided on the {where}")
            if device:
                check.flag(norm)
            elif not check.update_allowed(norm):
                raise _Skip
            return norm

        return clip_grad_norm_

    def skipping(original: Callable[..., Any]) -> Callable[..., Any]:
        def step(*args: Any, **kwargs: Any) -> Any:
            found_inf = check.found_inf
            if found_inf is None:  # the host path, or not in a train step
                return original(*args, **kwargs)
            optimizers = list(titan.optimizers)
            for optimizer in optimizers:
                optimizer.found_inf = found_inf
            try:
                result = original(*args, **kwargs)
            finally:
                for optimizer in optimizers:
                    del optimizer.found_inf
            if not check.after_step():
                raise _Skip
            return result

        return step

    ctx.wrap(trainer, "train_step", with_check)
    ctx.wrap(trainer, "forward_backward_step", keep_loss)
    ctx.wrap("torchtitan.distributed.utils", "clip_grad_norm_", checked)
    # On the instance: torch hooks an Optimizer subclass's `step` on the class at construction.
    ctx.wrap(titan.optimizers, "step", skipping)
