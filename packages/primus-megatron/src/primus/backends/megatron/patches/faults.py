"""Fault injection for the reliability tests, off unless a test sets PRIMUS_FAULT_NONFINITE."""

from __future__ import annotations

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
