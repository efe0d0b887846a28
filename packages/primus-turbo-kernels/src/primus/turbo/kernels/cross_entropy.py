"""Cross-entropy over a large vocabulary without an fp32 copy of the logits.

Forward: one program per row streams the row once in blocks (online max / sum-exp, plus the
row sum for label smoothing) and keeps only the per-row loss and logsumexp, both fp32.
Backward: one elementwise pass reads the row again and writes
`(softmax - (1 - eps) * onehot - eps / V) * grad_loss[row]` in the logits' dtype, either into a
new tensor or, with `inplace_grad=True`, into the logits' own storage.

So forward + backward reads the logits twice and writes the gradient once, whatever the
gradient of the loss is. Computing the gradient already in the forward (Liger) costs the same
two reads and one write there, and then the backward must read and write the whole gradient
again to multiply it by grad_output whenever that is not exactly 1 (TorchTitan divides the summed
loss by the token count, Megatron masks per-token losses), or synchronise to find out.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch import Tensor

from primus.turbo.kernels._common import differentiable, interpreting, kernel_op, launch, on_triton

REDUCTIONS = ("none", "sum", "mean")

# Forward: (largest BLOCK, elements a warp). 16384 elements on 16 warps, the most a ROCm
# work-group takes (1024 lanes), is 32 fp32 registers a lane on NVIDIA, with two block
# reductions per step. Backward: a plain elementwise pass, many programs of 16 elements a lane.
_FWD_LAUNCH = (16384, 1024)
_BWD_LAUNCH = (4096, 512)
# Start of the running max: finite, so a block of -inf logits (a masked vocabulary tail) gives
# exp(-inf - m) = 0 instead of exp(-inf + inf) = nan.
_MAX_START = -3.0e38


@triton.jit
def _ce_forward_kernel(
    logits_ptr,
    labels_ptr,
    loss_ptr,
    lse_ptr,
    stride_row,
    n_cols,
    ignore_index,
    target_weight,
    smooth_weight,
    MAX_START: tl.constexpr,
    SMOOTHING: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Per row: lse = logsumexp(x); loss = lse - (1 - eps) x[label] - eps mean(x); 0 if ignored."""
    row = tl.program_id(0).to(tl.int64)
    label = tl.load(labels_ptr + row).to(tl.int64)
    valid = label != ignore_index
    row_ptr = logits_ptr + row * stride_row
    # An ignored row is not read at all.
    end = tl.where(valid, n_cols, 0)
    m = tl.full([], MAX_START, tl.float32)
    d = tl.zeros([], tl.float32)
    row_sum = tl.zeros([], tl.float32)
    for start in range(0, end, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        in_row = cols < n_cols
        x = tl.load(row_ptr + cols, mask=in_row, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, 0))
        d = d * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), 0)
        m = m_new
        if SMOOTHING:
            row_sum += tl.sum(tl.where(in_row, x, 0.0), 0)
    lse = m + tl.log(tl.where(valid, d, 1.0))
    has_label = (label >= 0) & (label < end)
    x_label = tl.load(row_ptr + label, mask=has_label, other=0.0).to(tl.float32)
    loss = lse - target_weight * x_label
    if SMOOTHING:
        loss -= smooth_weight * row_sum
    tl.store(loss_ptr + row, tl.where(valid, loss, 0.0))
    tl.store(lse_ptr + row, tl.where(valid, lse, 0.0))


@triton.jit
def _ce_backward_kernel(
    logits_ptr,
    grad_ptr,
    labels_ptr,
    lse_ptr,
    dloss_ptr,
    stride_logits,
    stride_grad,
    stride_dloss,
    n_cols,
    n_blocks,
    ignore_index,
    target_weight,
    smooth_weight,
    BLOCK: tl.constexpr,
):
    """grad = (exp(x - lse) - (1 - eps) onehot - eps / V) * dloss[row]; 0 on ignored rows.

    `grad_ptr` may be `logits_ptr`: each element is read before it is written, by one program.
    """
    pid = tl.program_id(0).to(tl.int64)
    row = pid // n_blocks
    cols = (pid % n_blocks) * BLOCK + tl.arange(0, BLOCK)
    in_row = cols < n_cols
    label = tl.load(labels_ptr + row).to(tl.int64)
    valid = label != ignore_index
    # An ignored row is not read (a single comparison: the interpreter turns `bool & bool`
    # with a broadcast operand into int32, which it rejects as a mask).
    x = tl.load(
        logits_ptr + row * stride_logits + cols, mask=cols < tl.where(valid, n_cols, 0), other=0.0
    )
    lse = tl.load(lse_ptr + row)
    dloss = tl.load(dloss_ptr + row * stride_dloss).to(tl.float32)
    grad = tl.exp(x.to(tl.float32) - lse) - smooth_weight
    grad -= tl.where(cols == label, target_weight, 0.0)
    grad = tl.where(valid, grad * dloss, 0.0)
    tl.store(grad_ptr + row * stride_grad + cols, grad.to(grad_ptr.dtype.element_ty), mask=in_row)


def _weights(label_smoothing: float, n_cols: int) -> tuple[float, float]:
    """(weight of the label's logit, weight of every logit) in the smoothed target."""
    return 1.0 - label_smoothing, label_smoothing / n_cols


def _launch(n_cols: int, limits: tuple[int, int]) -> tuple[int, int]:
    """(BLOCK, num_warps) for rows of `n_cols`, given (largest BLOCK, elements a warp)."""
    max_block, per_warp = limits
    block = min(max_block, triton.next_power_of_2(n_cols))
    return block, 1 if interpreting() else max(1, min(16, block // per_warp))


@kernel_op("cross_entropy_fwd")
def _cross_entropy_fwd_op(
    logits: Tensor, labels: Tensor, ignore_index: int, label_smoothing: float, inplace_grad: bool
) -> tuple[Tensor, Tensor]:
    """Per-row (loss, logsumexp) in fp32 for 2-D `logits` with unit column stride.

    `inplace_grad` is only read by the backward, which then writes the gradient into `logits`.
    """
    n_rows, n_cols = logits.shape
    loss = torch.empty(n_rows, device=logits.device, dtype=torch.float32)
    lse = torch.empty_like(loss)
    target_weight, smooth_weight = _weights(label_smoothing, n_cols)
    block, warps = _launch(n_cols, _FWD_LAUNCH)
    launch(_ce_forward_kernel)[(n_rows,)](
        logits,
        labels,
        loss,
        lse,
        logits.stride(0),
        n_cols,
        ignore_index,
        target_weight,
        smooth_weight,
        MAX_START=_MAX_START,
        SMOOTHING=label_smoothing > 0.0,
        BLOCK=block,
        num_warps=warps,
    )
    return loss, lse


@_cross_entropy_fwd_op.register_fake
def _(
    logits: Tensor, labels: Tensor, ignore_index: int, label_smoothing: float, inplace_grad: bool
) -> tuple[Tensor, Tensor]:
    loss = logits.new_empty(logits.shape[0], dtype=torch.float32)
    return loss, torch.empty_like(loss)


def _launch_backward(
    logits: Tensor,
    labels: Tensor,
    lse: Tensor,
    grad_loss: Tensor,
    grad: Tensor,
    ignore_index: int,
    label_smoothing: float,
) -> None:
    n_rows, n_cols = logits.shape
    block, warps = _launch(n_cols, _BWD_LAUNCH)
    n_blocks = triton.cdiv(n_cols, block)
    target_weight, smooth_weight = _weights(label_smoothing, n_cols)
    launch(_ce_backward_kernel)[(n_rows * n_blocks,)](
        logits,
        grad,
        labels,
        lse,
        grad_loss,
        logits.stride(0),
        grad.stride(0),
        grad_loss.stride(0),
        n_cols,
        n_blocks,
        ignore_index,
        target_weight,
        smooth_weight,
        BLOCK=block,
        num_warps=warps,
    )


@kernel_op("cross_entropy_bwd")
def _cross_entropy_bwd_op(
    logits: Tensor,
    labels: Tensor,
    lse: Tensor,
    grad_loss: Tensor,
    ignore_index: int,
    label_smoothing: float,
) -> Tensor:
    """Gradient of the per-row losses (scaled by `grad_loss`, one value a row) w.r.t. `logits`."""
    grad = torch.empty_like(logits)
    _launch_backward(logits, labels, lse, grad_loss, grad, ignore_index, label_smoothing)
    return grad


@_cross_entropy_bwd_op.register_fake
def _(
    logits: Tensor,
    labels: Tensor,
    lse: Tensor,
    grad_loss: Tensor,
    ignore_index: int,
    label_smoothing: float,
) -> Tensor:
    return torch.empty_like(logits)


@kernel_op("cross_entropy_bwd_", mutates_args=("logits",))
def _cross_entropy_bwd_inplace_op(
    logits: Tensor,
    labels: Tensor,
    lse: Tensor,
    grad_loss: Tensor,
    ignore_index: int,
    label_smoothing: float,
) -> None:
    """`cross_entropy_bwd` written over `logits`."""
    _launch_backward(logits, labels, lse, grad_loss, logits, ignore_index, label_smoothing)


@_cross_entropy_bwd_inplace_op.register_fake
def _(
    logits: Tensor,
    labels: Tensor,
    lse: Tensor,
    grad_loss: Tensor,
    ignore_index: int,
    label_smoothing: float,
) -> None:
    return None


def _setup_context(ctx: Any, inputs: tuple, output: tuple) -> None:
    logits, labels, ignore_index, label_smoothing, inplace_grad = inputs
    _, lse = output
    ctx.mark_non_differentiable(lse)
    ctx.save_for_backward(logits, labels, lse)
    ctx.ignore_index, ctx.label_smoothing, ctx.inplace_grad = (
        ignore_index,
        label_smoothing,
        inplace_grad,
    )


def _backward(
    ctx: Any, grad_loss: Tensor, _grad_lse: Tensor
) -> tuple[Tensor, None, None, None, None]:
    logits, labels, lse = ctx.saved_tensors
    args = (labels, lse, grad_loss, ctx.ignore_index, ctx.label_smoothing)
    if ctx.inplace_grad:
        # Declared mutation: autograd bumps the logits' version, so another op that saved them
        # and runs its backward later raises instead of reading the gradient.
        torch.ops.primus_turbo.cross_entropy_bwd_(logits, *args)
        grad = logits
    else:
        grad = torch.ops.primus_turbo.cross_entropy_bwd(logits, *args)
    return grad, None, None, None, None


_cross_entropy_fwd = differentiable(_cross_entropy_fwd_op, _setup_context, _backward)


def check_args(label_smoothing: float, reduction: str) -> None:
    """ValueError unless `reduction` is one of REDUCTIONS and 0 <= label_smoothing <= 1."""
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1], got {label_smoothing}")


def _reduce(losses: Tensor, labels: Tensor, ignore_index: int, reduction: str) -> Tensor:
    """Per-row fp32 losses to `reduction`; "mean" divides by the non-ignored count (nan if 0)."""
    if reduction == "none":
        return losses.view(labels.shape)
    if reduction == "sum":
        return losses.sum()
    return losses.sum() / (labels != ignore_index).sum()


def cross_entropy(
    logits: Tensor,
    labels: Tensor,
    *,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    reduction: str = "mean",
    inplace_grad: bool = False,
) -> Tensor:
    """`F.cross_entropy(logits.float(), labels, ...)` without the fp32 copy; fp32 result.

    logits [..., V] in bf16/fp16/fp32, labels [...] integer. "mean" averages over non-ignored
    tokens (nan when all are ignored, as in torch); "none" gives 0 for ignored tokens. Labels
    outside [0, V) other than `ignore_index` are not checked (no device sync) and give garbage.

    inplace_grad: the backward writes the logits' gradient into the logits' storage instead of
    a new tensor, saving one [N, V] buffer (logits that cannot be viewed as [N, V] rows of unit
    stride are copied, and the copy takes the gradient). The logits stay intact until the
    backward; after it they hold the gradient, so nothing may read them then (Megatron's and
    TorchTitan's loss paths don't). The write is a declared mutation (`mutates_args`): an op
    that saved the same logits for its own backward fails autograd's version check rather than
    reading the gradient, and torch.compile sees it (Inductor writes into the saved logits).
    """
    check_args(label_smoothing, reduction)
    if not on_triton(logits):
        return cross_entropy_reference(
            logits,
            labels,
            ignore_index=ignore_index,
            label_smoothing=label_smoothing,
            reduction=reduction,
        )
    rows = logits.reshape(-1, logits.shape[-1])
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    losses, _ = _cross_entropy_fwd(
        rows, labels.reshape(-1), ignore_index, float(label_smoothing), inplace_grad
    )
    return _reduce(losses, labels, ignore_index, reduction)


def cross_entropy_reference(
    logits: Tensor,
    labels: Tensor,
    *,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    reduction: str = "mean",
) -> Tensor:
    """What eager users run: `F.cross_entropy` on an fp32 copy of the logits."""
    loss = F.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]),
        labels.reshape(-1),
        ignore_index=ignore_index,
        label_smoothing=label_smoothing,
        reduction=reduction,
    )
    return loss.view(labels.shape) if reduction == "none" else loss
