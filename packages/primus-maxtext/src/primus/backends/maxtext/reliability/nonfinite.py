"""Non-finite numbers: a step whose loss or gradient norm is NaN/Inf keeps the weights and the
optimizer state it started from, and `max_skipped_steps` of them in a row stop the run with a
checkpoint of that state (primus.core.reliability.nonfinite)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from primus.backends.maxtext.maxtext_adapter import TESTED
from primus.backends.maxtext.reliability.stopping import TRAIN, save_step
from primus.core.patches import PatchContext, register_patch
from primus.core.reliability.nonfinite import SkippedSteps

LOSS, GRAD_NORM = "learning/loss", "learning/raw_grad_norm"  # the train step's scalars


@register_patch(
    "maxtext.nonfinite_keys",
    backend="maxtext",
    phase="setup",
    backend_versions=TESTED,
    target="MaxText config abort_on_nan_loss, abort_on_inf_loss",
    tags=("reliability",),
)
def no_upstream_abort(ctx: PatchContext) -> None:
    """MaxText's own NaN/Inf abort (sys.exit(1) one step late, no checkpoint) is off:
    Primus's max_skipped_steps decides (patch maxtext.nonfinite)."""
    for key in ("abort_on_nan_loss", "abort_on_inf_loss"):
        ctx.set_param(key, False, "a non-finite step is skipped up to max_skipped_steps")


def is_step_counter(path: tuple[Any, ...]) -> bool:
    """Whether a train state leaf's key path is the optimizer's step counter."""
    names = [str(getattr(k, "key", getattr(k, "name", k))) for k in path]
    return names[:2] == ["optimizer", "step"]


def keep_state_when_not_finite(original: Callable[..., Any]) -> Callable[..., Any]:
    """MaxText's jitted train step, whose new state is the old one (but for the step counter,
    so that the step, the data position and the checkpoints go on) when the loss or the
    gradient norm is not finite: the optimizer update is dropped inside the step."""

    def train_step(model: Any, config: Any, state_shardings: Any, params_shardings: Any,
                   state: Any, data: Any, *rng: Any) -> tuple[Any, dict[str, Any]]:  # fmt: skip
        import jax
        import jax.numpy as jnp

        old = jax.tree_util.tree_leaves(state)  # before the step updates it in place
        new, metrics = original(model, config, state_shardings, params_shardings, state, data, *rng)
        scalars = metrics["scalar"]
        finite = jnp.isfinite(scalars[LOSS])
        if GRAD_NORM in scalars:  # absent with optimizer_memory_host_offload
            finite &= jnp.isfinite(scalars[GRAD_NORM])
        leaves, treedef = jax.tree_util.tree_flatten_with_path(new)
        kept = [
            leaf
            if is_step_counter(path) or jnp.issubdtype(leaf.dtype, jax.dtypes.extended)
            else jnp.where(finite, leaf, before)
            for (path, leaf), before in zip(leaves, old, strict=True)
        ]
        return jax.tree_util.tree_unflatten(treedef, kept), metrics

    return train_step


class StepWatch:
    """Feeds each step's loss and gradient norm to `guard` without waiting for the step: a
    step is looked at after the next one was dispatched (when MaxText's metric logger reads
    it too), except while one more non-finite step would end the run (then at once, so that
    the state in hand is still the last good one)."""

    def __init__(self, guard: SkippedSteps) -> None:
        self.guard = guard
        self.pending: tuple[int, dict[str, Any]] | None = None

    def after(self, step: int, metrics: dict[str, Any], last: bool) -> bool:
        """MaxText's step `step` was dispatched: whether the run must stop now."""
        if self.pending is not None:
            self._observe(*self.pending)
        self.pending = (step, metrics)
        if last or len(self.guard.in_row) + 1 >= self.guard.limit:
            self._observe(*self.pending)
            self.pending = None
        return self.guard.exhausted

    def _observe(self, step: int, metrics: dict[str, Any]) -> None:
        scalars = metrics["scalar"]
        norm = scalars.get(GRAD_NORM)
        values = {"loss": float(scalars[LOSS]), "grad norm": None if norm is None else float(norm)}
        self.guard.observe(step + 1, values)  # Primus's step numbers, as in metrics.jsonl


@register_patch(
    "maxtext.nonfinite",
    backend="maxtext",
    phase="before_train",
    backend_versions=TESTED,
    target=f"{TRAIN}.train_step, {TRAIN}.training_loop_iteration",
    tags=("reliability",),
)
def skip_nonfinite(ctx: PatchContext) -> None:
    """A NaN/Inf loss or gradient norm drops that step's update inside MaxText's jitted train
    step (weights and optimizer state stay); the step is logged with its number; at
    max_skipped_steps in a row the run saves that state (orbax) and stops with exit code 1."""
    guard = SkippedSteps.from_params(ctx)

    def watched(original: Callable[..., Any]) -> Callable[..., Any]:
        watch = StepWatch(guard)

        def training_loop_iteration(
            jax_device_state: dict[str, Any], python_vars: dict[str, Any], immutable_data: dict
        ) -> Any:
            metrics = original(jax_device_state, python_vars, immutable_data)
            last = python_vars["step"] + 1 >= immutable_data["steps"]
            if watch.after(python_vars["step"], metrics, last):
                config = immutable_data["config"]
                raise guard.error(save_step(jax_device_state, python_vars, config))
            return metrics

        return training_loop_iteration

    ctx.wrap(TRAIN, "train_step", keep_state_when_not_finite)
    ctx.wrap(TRAIN, "training_loop_iteration", watched)
