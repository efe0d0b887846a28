"""Megatron instruments for the reliability tests, each off unless a test sets its environment
variable: non-finite steps (PRIMUS_FAULT_NONFINITE), the samples each step trains on
(PRIMUS_LOG_SAMPLES). Loading this module imports neither megatron nor torch: the handlers do,
and they run only in a Megatron run."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from typing import Any

from primus.core.patches import PatchContext, register_patch

ENV = "PRIMUS_FAULT_NONFINITE"  # KIND:STEPS, e.g. loss:5,6 (the loss is NaN) or grad:7
KINDS = ("loss", "grad")


def _requested(ctx: PatchContext) -> bool:
    """PRIMUS_FAULT_NONFINITE is set (tests only)"""
    return bool(os.environ.get(ENV))


def _faulty(original: Callable, kind: str, steps: set[int]) -> Callable:
    import torch
    from megatron.training import get_args

    def loss_func(*args: Any) -> Any:
        loss, tokens, report = original(*args)
        if get_args().curr_iteration + 1 not in steps:
            return loss, tokens, report
        if kind == "loss":  # a NaN loss: its gradients are NaN as well
            nan = torch.tensor([float("nan"), 1.0], device=loss.device)
            return loss * nan[0], tokens, {**report, "lm loss": report["lm loss"] * nan}
        loss.register_hook(lambda grad: grad * float("inf"))  # a finite loss, Inf/NaN gradients
        return loss, tokens, report

    return loss_func


@register_patch(
    "megatron.fault_nonfinite",
    backend="megatron",
    phase="before_train",
    condition=_requested,
    target="primus.backends.megatron.providers.loss_func",
    tags=("testing",),
)
def fault_nonfinite(ctx: PatchContext) -> None:
    """Make the loss (`loss`) or the gradients (`grad`) of the listed steps non-finite, for
    real, in the backward pass: PRIMUS_FAULT_NONFINITE=loss:5,6 or grad:7,8,9."""
    kind, _, steps = os.environ[ENV].partition(":")
    assert kind in KINDS and steps, f"{ENV}={os.environ[ENV]}: want KIND:STEPS, KIND in {KINDS}"
    chosen = {int(step) for step in steps.split(",")}
    ctx.wrap(
        "primus.backends.megatron.providers",
        "loss_func",
        lambda original: _faulty(original, kind, chosen),
    )


SAMPLES_ENV = "PRIMUS_LOG_SAMPLES"  # 1: samples-rank<R>.jsonl in the run dir


def _log_samples_requested(ctx: PatchContext) -> bool:
    """PRIMUS_LOG_SAMPLES is set (tests only)"""
    return bool(os.environ.get(SAMPLES_ENV))


def _logged(original: Callable, out: Any) -> Callable:
    from megatron.training import get_args

    def get_batch(data_iterator: Any) -> Any:
        batch = original(data_iterator)
        rows = [
            hashlib.sha1(row.cpu().numpy().tobytes()).hexdigest()[:16] for row in batch["tokens"]
        ]
        out.write(json.dumps({"step": get_args().curr_iteration + 1, "samples": rows}) + "\n")
        out.flush()
        return batch

    return get_batch


@register_patch(
    "megatron.log_samples",
    backend="megatron",
    phase="before_train",
    condition=_log_samples_requested,
    target="primus.backends.megatron.providers.get_batch",
    tags=("testing",),
)
def log_samples(ctx: PatchContext) -> None:
    """Append the step and a hash of every sample of each micro-batch this rank trains on to
    samples-rank<R>.jsonl in the run dir (PRIMUS_LOG_SAMPLES=1)."""
    assert ctx.run_dir is not None, "the runtime always sets the run directory"
    out = open(ctx.run_dir / f"samples-rank{os.environ.get('RANK', '0')}.jsonl", "a")  # noqa: SIM115
    ctx.wrap(
        "primus.backends.megatron.providers", "get_batch", lambda original: _logged(original, out)
    )
