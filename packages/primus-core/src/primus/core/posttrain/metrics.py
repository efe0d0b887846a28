"""Masked loss and token accuracy, defined once for every backend.

Over the positions where loss_mask is 1 (assistant/completion targets), across the whole
batch or eval set, every token weighing the same (not a mean of per-row means):

    loss            = sum(cross_entropy(logits, labels) * mask) / sum(mask)
    token_accuracy  = sum((argmax(logits) == labels) * mask) / sum(mask)

A backend adds up the three sums (`TokenStats`) over its micro-batches and data-parallel
ranks, then divides: `eval_loss` and `eval_token_accuracy` (`TokenStats.as_metrics("eval_")`).
Cross-entropy is computed in float32; the torch variant sums in float64.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TokenStats:
    """Sums over masked positions: cross-entropy, correct argmax predictions, positions."""

    loss_sum: float = 0.0
    correct: float = 0.0
    count: float = 0.0

    def __add__(self, other: TokenStats) -> TokenStats:
        return TokenStats(
            self.loss_sum + other.loss_sum, self.correct + other.correct, self.count + other.count
        )

    @property
    def loss(self) -> float:
        return self.loss_sum / self.count if self.count else float("nan")

    @property
    def accuracy(self) -> float:
        return self.correct / self.count if self.count else float("nan")

    def as_metrics(self, prefix: str = "eval_") -> dict[str, float]:
        return {f"{prefix}loss": self.loss, f"{prefix}token_accuracy": self.accuracy}


def masked_mean(values: Any, loss_mask: Any) -> Any:
    """sum(values * mask) / sum(mask): the loss over the trained tokens, for numpy, torch or
    jax arrays alike (a backend's train loss from its per-token losses)."""
    return (values * loss_mask).sum() / loss_mask.sum()


def token_sums(logits: Any, labels: Any, loss_mask: Any, xp: Any = None) -> tuple[Any, Any, Any]:
    """`token_stats`' three sums as 0-d arrays of `xp`: traceable, so a backend can compute
    them inside a compiled step (`jax.jit`)."""
    if xp is None:
        import numpy as xp
    logits = xp.asarray(logits).astype(xp.float32)
    labels, mask = xp.asarray(labels), xp.asarray(loss_mask).astype(xp.float32)
    top = logits.max(axis=-1, keepdims=True)
    logsumexp = xp.log(xp.exp(logits - top).sum(axis=-1)) + top[..., 0]
    target = xp.take_along_axis(logits, labels[..., None].astype(xp.int32), axis=-1)[..., 0]
    correct = (logits.argmax(axis=-1) == labels) * mask
    return ((logsumexp - target) * mask).sum(), correct.sum(), mask.sum()


def token_stats(logits: Any, labels: Any, loss_mask: Any, xp: Any = None) -> TokenStats:
    """The sums of one batch: logits (..., vocab), labels and loss_mask (...). `xp` is the
    array module (numpy by default; jax.numpy works too)."""
    return TokenStats(*(float(s) for s in token_sums(logits, labels, loss_mask, xp)))


def token_stats_torch(logits: Any, labels: Any, loss_mask: Any) -> Any:
    """The sums of one batch as a float64 torch tensor [loss_sum, correct, count], ready for
    one all-reduce; `TokenStats(*tensor.tolist())` afterwards. Imports torch."""
    import torch
    import torch.nn.functional as F

    mask = loss_mask.to(torch.float64)
    losses = F.cross_entropy(
        logits.float().flatten(0, -2), labels.flatten().long(), reduction="none"
    ).view_as(mask)
    correct = (logits.argmax(dim=-1) == labels).to(torch.float64)
    return torch.stack([(losses.double() * mask).sum(), (correct * mask).sum(), mask.sum()])
