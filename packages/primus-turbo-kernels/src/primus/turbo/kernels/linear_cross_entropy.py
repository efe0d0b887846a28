"""Output projection + cross-entropy without the [N, V] logits.

The forward walks the tokens in chunks. For each chunk it computes the chunk's logits with a
matmul, runs the cross-entropy kernels over them (loss, then the gradient written over the
logits in place), and folds that gradient into the input gradients right away:
grad_hidden[chunk] = grad_logits @ weight and grad_weight += grad_logits.T @ hidden[chunk].
Only one chunk of logits is ever alive. The stored gradients are those of the summed loss; the
backward multiplies them by grad_output (and 1 / valid tokens for "mean"): [N, H] and [V, H]
work, nothing over the vocabulary of every token.

grad_weight accumulates in fp32 ([V, H] fp32 for the whole forward): each chunk's product is
added inside the GEMM (`addmm(..., out_dtype=float32)` on GPUs), so nothing is rounded to bf16
until the backward's single cast to the weight's dtype.

Autograd is a `torch.autograd.Function` around matmuls and the cross-entropy custom ops;
torch.compile(fullgraph=True) traces it whole (the chunk loop is unrolled).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from primus.turbo.kernels._common import on_triton
from primus.turbo.kernels.cross_entropy import check_args, cross_entropy_reference

# Logits of one chunk: big enough that grad_weight's GEMM (chunk rows deep, fp32 [V, H] read and
# written once per chunk) stays compute-bound, small next to the activations.
_CHUNK_BYTES = 512 * 2**20
_ROW_ALIGN = 256


def _chunk_rows(vocab: int, itemsize: int, chunk_size: int | None) -> int:
    if chunk_size is not None:
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be positive, got {chunk_size}")
        return chunk_size
    rows = _CHUNK_BYTES // (vocab * itemsize) // _ROW_ALIGN * _ROW_ALIGN
    return max(_ROW_ALIGN, rows)


def _accumulate_fp32(acc: Tensor, a: Tensor, b: Tensor) -> None:
    """acc += a @ b for an fp32 `acc`, without fp32 copies of bf16/fp16 `a`, `b` on GPUs."""
    if a.dtype == torch.float32:
        acc.addmm_(a, b)
    elif acc.device.type == "cpu":  # addmm's out_dtype overload is GPU-only
        acc.addmm_(a.float(), b.float())
    else:
        torch.addmm(acc, a, b, out_dtype=torch.float32, out=acc)


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx,
        hidden: Tensor,
        weight: Tensor,
        labels: Tensor,
        ignore_index: int,
        label_smoothing: float,
        reduction: str,
        chunk_size: int | None,
        grad_enabled: bool,
    ) -> Tensor:
        h = hidden.reshape(-1, hidden.shape[-1])
        y = labels.reshape(-1)
        n_rows = h.shape[0]
        chunk = _chunk_rows(weight.shape[0], weight.element_size(), chunk_size)
        # needs_input_grad ignores no_grad(); the caller's grad mode is passed in.
        need_h, need_w = (grad_enabled and need for need in ctx.needs_input_grad[:2])
        grad_h = torch.empty(h.shape, dtype=h.dtype, device=h.device) if need_h else None
        grad_w = weight.new_zeros(weight.shape, dtype=torch.float32) if need_w else None
        # The gradient of each token's loss in the summed loss: 1.
        ones = h.new_ones(1, dtype=torch.float32).expand(chunk)
        total = h.new_zeros((), dtype=torch.float32)
        for start in range(0, n_rows, chunk):
            end = min(start + chunk, n_rows)
            h_c, y_c = h[start:end], y[start:end]
            logits = h_c @ weight.t()
            losses, lse = torch.ops.primus_turbo.cross_entropy_fwd(
                logits, y_c, ignore_index, label_smoothing, False
            )
            total = total + losses.sum()
            if not (need_h or need_w):
                continue
            torch.ops.primus_turbo.cross_entropy_bwd_(
                logits, y_c, lse, ones[: end - start], ignore_index, label_smoothing
            )
            if grad_h is not None:
                torch.mm(logits, weight, out=grad_h[start:end])
            if grad_w is not None:
                _accumulate_fp32(grad_w, logits.t(), h_c)
        if reduction == "mean":
            count = (y != ignore_index).sum()
            loss = total / count  # nan when every token is ignored, as in torch
            grad_scale = 1.0 / count.clamp(min=1)  # those tokens' gradients are already 0
        else:
            loss = total
            grad_scale = total.new_ones(())
        ctx.save_for_backward(grad_h, grad_w, grad_scale)
        ctx.hidden_shape, ctx.weight_dtype = hidden.shape, weight.dtype
        return loss

    @staticmethod
    def backward(ctx, grad_loss: Tensor):
        grad_h, grad_w, grad_scale = ctx.saved_tensors
        scale = grad_loss * grad_scale
        grad_hidden = None if grad_h is None else (grad_h * scale).view(ctx.hidden_shape)
        grad_weight = None if grad_w is None else (grad_w * scale).to(ctx.weight_dtype)
        return grad_hidden, grad_weight, None, None, None, None, None, None


def linear_cross_entropy(
    hidden: Tensor,
    weight: Tensor,
    labels: Tensor,
    *,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    reduction: str = "mean",
    chunk_size: int | None = None,
) -> Tensor:
    """`cross_entropy(hidden @ weight.T, labels)` (fp32 loss) with at most one chunk of logits.

    hidden [..., H] and weight [V, H] in one dtype, labels [...]. Reductions "mean" (over
    non-ignored tokens; nan if none) and "sum". chunk_size: tokens a chunk (default: about
    512 MiB of logits). The gradients are computed in the forward when hidden or weight
    requires grad, so the forward costs three matmuls and keeps an fp32 [V, H] buffer alive
    until the backward.
    """
    if reduction == "none":
        raise ValueError(
            'linear_cross_entropy supports reduction "mean" and "sum"; per-token losses: '
            "use cross_entropy on the logits"
        )
    check_args(label_smoothing, reduction)
    if not on_triton(hidden, weight):
        return linear_cross_entropy_reference(
            hidden,
            weight,
            labels,
            ignore_index=ignore_index,
            label_smoothing=label_smoothing,
            reduction=reduction,
        )
    return _LinearCrossEntropy.apply(
        hidden,
        weight,
        labels,
        ignore_index,
        float(label_smoothing),
        reduction,
        chunk_size,
        torch.is_grad_enabled(),
    )


def linear_cross_entropy_reference(
    hidden: Tensor,
    weight: Tensor,
    labels: Tensor,
    *,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    reduction: str = "mean",
) -> Tensor:
    """`F.cross_entropy((hidden @ weight.T).float(), labels)`: the full logits, then fp32."""
    return cross_entropy_reference(
        F.linear(hidden, weight),
        labels,
        ignore_index=ignore_index,
        label_smoothing=label_smoothing,
        reduction=reduction,
    )
