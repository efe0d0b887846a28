"""FP8 quantization for `fp8_linear`: a scale per tensor or per row, and the cast.

Current scaling takes the amax of the tensor being cast (one `vector_norm` reduction, then
the cast). Delayed scaling (`AmaxHistory`) takes the largest amax of the operand's last calls
instead, and the cast kernel records this call's amax as it casts (an atomic max per tile),
so no pass over the tensor is spent on its amax: Transformer Engine's default recipe.

The cast is a Triton kernel on a GPU (scale, saturate and cast in one pass, reading any
strides, so a transposed copy costs no extra transpose), PyTorch ops elsewhere. The
current-scaling cast is an op (`primus_turbo::fp8_cast`), so `torch.compile` runs the same
kernel; delayed scaling keeps state outside the graph and runs eagerly (or in CUDA graphs).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from primus.turbo.kernels._common import eager_impl, kernel_op, launch

E4M3 = torch.float8_e4m3fn
E5M2 = torch.float8_e5m2
_EPS = 1e-12  # the smallest amax: an all-zero tensor gets a finite scale
HISTORY = 16  # delayed scaling: the calls whose largest amax scales the next one


@triton.jit
def _cast_kernel(
    x, scale, out, amax, M, N, stride_xm, stride_xn, fp8_max,
    TRACK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """out[m, n] = saturate(x[m, n] / scale[m]), row-major, x of any strides; with TRACK,
    amax[0] = max(amax[0], |x|) too."""
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)[:, None]
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    mask = (rm < M) & (rn < N)
    v = tl.load(x + rm * stride_xm + rn * stride_xn, mask=mask, other=0.0).to(tl.float32)
    s = tl.load(scale + rm, mask=rm < M, other=1.0)
    q = tl.clamp(v / s, -fp8_max, fp8_max).to(out.dtype.element_ty)
    tl.store(out + rm * N + rn, q, mask=mask)
    if TRACK:
        tl.atomic_max(amax, tl.max(tl.abs(v)))


@triton.jit
def _roll_kernel(history, scale, fp8_max, eps, SIZE: tl.constexpr):
    """scale = max(history) / fp8_max, then history shifts one place (the oldest amax drops)
    and history[0] = 0, for the next cast to raise."""
    i = tl.arange(0, SIZE)
    held = tl.load(history + i)
    older = tl.load(history + i - 1, mask=i > 0, other=0.0)
    tl.debug_barrier()  # every thread read before any writes
    tl.store(history + i, older)
    tl.store(scale, tl.maximum(tl.max(held), eps) / fp8_max)


def _scale(x: torch.Tensor, dtype: torch.dtype, rowwise: bool) -> torch.Tensor:
    """The dequantization scale of the 2-D `x`: amax / FP8 max, fp32 [1, 1], or [rows, 1]
    (each row's amax) with `rowwise`."""
    dims = (1,) if rowwise else (0, 1)
    amax = torch.linalg.vector_norm(x, math.inf, dim=dims, keepdim=True, dtype=torch.float32)
    return amax.clamp(min=_EPS) / torch.finfo(dtype).max


def _launch_cast(
    x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype, amax: torch.Tensor | None
) -> torch.Tensor:
    """`_cast_kernel` over the 2-D `x` on a GPU; `amax` (one fp32) raised to x's, if given."""
    rows, cols = x.shape
    out = torch.empty(rows, cols, dtype=dtype, device=x.device)
    per_row = scale.expand(rows, 1).contiguous()
    grid = (triton.cdiv(rows, 64), triton.cdiv(cols, 64))
    fp8_max = torch.finfo(dtype).max
    track = amax is not None
    launch(_cast_kernel)[grid](
        x, per_row, out, amax if track else per_row, rows, cols, *x.stride(), fp8_max,
        TRACK=track, BLOCK_M=64, BLOCK_N=64,
    )  # fmt: skip
    return out


def _cast(x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Row-major FP8 copy of the 2-D `x` (any strides) divided by `scale` ([1, 1] or [rows, 1])
    and saturated: the Triton kernel on a GPU, PyTorch ops elsewhere."""
    fp8_max = torch.finfo(dtype).max
    if not x.is_cuda:
        return (x.float() / scale).clamp(-fp8_max, fp8_max).to(dtype).contiguous()
    return fp8_cast(x, scale, dtype)


@kernel_op("fp8_cast")
def _fp8_cast_op(x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`_cast_kernel` over the 2-D `x` on a GPU. An op, so torch.compile runs this kernel too
    rather than writing its own cast."""
    return _launch_cast(x, scale, dtype, None)


fp8_cast = eager_impl(_fp8_cast_op)


class AmaxHistory:
    """Delayed scaling's state for one operand of one layer: the amaxes of its last
    `HISTORY` casts (fp32, on the operand's device). The first cast is scaled by its own amax
    (one reduction), every later one by the largest amax held, which the cast then updates."""

    def __init__(self, device: torch.device) -> None:
        self.amaxes = torch.zeros(HISTORY, dtype=torch.float32, device=device)
        self.primed = False

    def next_scale(self, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The scale for casting `x` (fp32, one element); leaves `amaxes[0]` at 0 for the
        cast to raise to x's amax."""
        if not self.primed:  # the first call has no history: its own amax, as current scaling
            self.amaxes[0] = torch.linalg.vector_norm(x, math.inf, dtype=torch.float32)
            self.primed = True
        fp8_max = torch.finfo(dtype).max
        if not x.is_cuda:
            scale = self.amaxes.max().clamp(min=_EPS).reshape(1, 1) / fp8_max
            self.amaxes[1:] = self.amaxes[:-1].clone()
            self.amaxes[0] = 0.0
            return scale
        scale = torch.empty(1, 1, dtype=torch.float32, device=x.device)
        _roll_kernel[(1,)](self.amaxes, scale, fp8_max, _EPS, SIZE=HISTORY, num_warps=1)
        return scale

    def cast(self, x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """`x` cast with `scale`, its amax recorded as this call's."""
        if not x.is_cuda:
            amax = torch.linalg.vector_norm(x, math.inf, dtype=torch.float32)
            self.amaxes[0] = torch.maximum(self.amaxes[0], amax)
            return _cast(x, scale, dtype)
        return _launch_cast(x, scale, dtype, self.amaxes)


def quantize_rows(
    x: torch.Tensor, dtype: torch.dtype, rowwise: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Row-major FP8 `x` [R, C] and its scale: one-element, or [R, 1] (the amax of each row)
    with `rowwise`."""
    scale = _scale(x, dtype, rowwise)
    return _cast(x, scale, dtype), scale if rowwise else scale.reshape(())


def quantize_both(
    x: torch.Tensor, dtype: torch.dtype, history: AmaxHistory | None = None
) -> tuple[torch.Tensor, ...]:
    """Row-major FP8 `x` and `x.T` with their one (tensorwise) scale: current scaling, or
    delayed with the operand's `history`."""
    if history is None:
        scale = _scale(x, dtype, False)
        q = _cast(x, scale, dtype)
    else:
        scale = history.next_scale(x, dtype)
        q = history.cast(x, scale, dtype)
    return q, _cast(x.t(), scale, dtype), scale.reshape(())
