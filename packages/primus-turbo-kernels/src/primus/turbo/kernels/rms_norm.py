"""RMSNorm and residual-add + RMSNorm: y = x * rsqrt(mean(x^2) + eps) * weight, in fp32.

The forward keeps whole rows in registers (several rows per program when H is small) and
stores rstd [rows] for the backward. The backward runs one program per SM; each walks a
band of rows (loading the next rows while it computes), writes dx per row and one fp32 row of
partial weight-grad sums, and the partials are summed afterwards.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch import nn

from primus.turbo.kernels._common import (
    differentiable,
    interpreting,
    kernel_op,
    launch,
    on_triton,
    row_launch,
)

# Elements a program holds at once (rows are grouped up to this when H is small): the
# forward's tile, and the backward's with its warps. The backward values were the best of a
# sweep on an H100 (tile 1024-8192, 4-16 warps, 1-4 programs per SM, 1-3 stages) at
# [4096, 2048], [4096, 4096], [8192, 2048] and [16384, 8192] bf16.
_TILE = 4096
_BWD_TILE, _BWD_WARPS = 8192, 8


@triton.jit
def _fwd_kernel(
    x_ptr,
    r_ptr,
    w_ptr,
    y_ptr,
    h_ptr,
    rstd_ptr,
    M,
    H,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    row_ok = rows < M
    col_ok = cols < H
    mask = row_ok[:, None] & col_ok[None, :]
    offs = rows.to(tl.int64)[:, None] * H + cols[None, :]
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        h = (x + tl.load(r_ptr + offs, mask=mask, other=0.0).to(tl.float32)).to(
            h_ptr.dtype.element_ty
        )
        tl.store(h_ptr + offs, h, mask=mask)
        x = h.to(tl.float32)  # normalize the stored h, which is what the backward reads
    rstd = tl.rsqrt(tl.sum(x * x, axis=1) / H + eps)
    w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    y = x * rstd[:, None] * w[None, :]
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(rstd_ptr + rows, rstd, mask=row_ok)


@triton.jit
def _bwd_kernel(
    dy_ptr,
    x_ptr,
    w_ptr,
    rstd_ptr,
    dh_ptr,
    dx_ptr,
    dw_ptr,
    M,
    H,
    tiles_per_program,
    HAS_DH: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    STAGES: tl.constexpr,
):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    col_ok = cols < H
    w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    dw = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    first = pid * tiles_per_program
    for tile in tl.range(first, first + tiles_per_program, num_stages=STAGES):
        rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
        row_ok = rows < M
        mask = row_ok[:, None] & col_ok[None, :]
        offs = rows.to(tl.int64)[:, None] * H + cols[None, :]
        x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(rstd_ptr + rows, mask=row_ok, other=0.0)[:, None]
        xhat = x * rstd
        g = dy * w
        dot = tl.sum(g * xhat, axis=1)[:, None] / H
        dx = (g - xhat * dot) * rstd
        if HAS_DH:
            dx += tl.load(dh_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(dx_ptr + offs, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        dw += dy * xhat
    tl.store(dw_ptr + pid * H + cols, tl.sum(dw, axis=0), mask=col_ok)


def _tile(rows: int, hidden: int, tile: int) -> tuple[int, int]:
    """(BLOCK_M, BLOCK_N): whole rows, grouped up to `tile` elements."""
    block_n = triton.next_power_of_2(hidden)
    return min(max(1, tile // block_n), triton.next_power_of_2(max(rows, 1))), block_n


@functools.cache
def _device(device: torch.device) -> tuple[int, int]:
    """(SMs, CUs or Xe-cores; shared memory bytes one program may use, 0 if unknown)."""
    props = getattr(torch, device.type).get_device_properties(device)
    processors = getattr(props, "multi_processor_count", None) or props.gpu_subslice_count
    return processors, getattr(props, "shared_memory_per_block_optin", 0)


def _schedule(tiles: int, tile_bytes: int, device: torch.device) -> tuple[int, int, int]:
    """(programs, tiles per program, loop stages) of the backward: one program per SM, each
    walking a band of tiles and loading the next ones while it computes (up to 3 stages,
    through shared memory, as many as fit)."""
    if interpreting():
        target, stages = 3, 1
    else:
        sms, smem = _device(device)
        target = sms
        stages = max(1, min(3, smem // tile_bytes)) if smem else 1
    per_program = max(1, triton.cdiv(tiles, target))
    return triton.cdiv(tiles, per_program), per_program, stages


def _forward(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """(y, h or None, rstd) for x [rows, H]."""
    x, weight = x.contiguous(), weight.contiguous()
    rows, hidden = x.shape
    y = torch.empty_like(x)
    h = None if residual is None else torch.empty_like(x)
    rstd = torch.empty(rows, device=x.device, dtype=torch.float32)
    block_m, block_n = _tile(rows, hidden, _TILE)
    _, warps = row_launch(block_m * block_n, x.element_size())
    launch(_fwd_kernel)[(triton.cdiv(rows, block_m),)](
        x,
        None if residual is None else residual.contiguous(),
        weight,
        y,
        h,
        rstd,
        rows,
        hidden,
        eps,
        HAS_RESIDUAL=residual is not None,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        num_warps=warps,
    )
    return y, h, rstd


@kernel_op("rms_norm_fwd")
def rms_norm_fwd(
    x: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, rstd) for x [rows, H]: rstd [rows] fp32 is what the backward needs."""
    y, _, rstd = _forward(x, None, weight, eps)
    return y, rstd


@kernel_op("add_rms_norm_fwd")
def add_rms_norm_fwd(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(rms_norm(h), h, rstd) with h = x + residual, all [rows, H] but rstd [rows] fp32."""
    y, h, rstd = _forward(x, residual, weight, eps)
    assert h is not None  # given a residual, _forward returns x + residual
    return y, h, rstd


@kernel_op("rms_norm_bwd")
def rms_norm_bwd(
    dy: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    rstd: torch.Tensor,
    dh: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(dx, dweight) for y = rms_norm(x) [rows, H]; `dh`, the grad of the residual sum when
    there is one, is added to dx."""
    dy, x, weight = dy.contiguous(), x.contiguous(), weight.contiguous()
    rows, hidden = x.shape
    dx = torch.empty_like(x)
    block_m, block_n = _tile(rows, hidden, _BWD_TILE)
    warps = 1 if interpreting() else _BWD_WARPS
    loaded = [dy, x] if dh is None else [dy, x, dh]
    tile_bytes = block_m * block_n * sum(t.element_size() for t in loaded)
    programs, per_program, stages = _schedule(triton.cdiv(rows, block_m), tile_bytes, x.device)
    partial = torch.empty(programs, hidden, device=x.device, dtype=torch.float32)
    launch(_bwd_kernel)[(programs,)](
        dy,
        x,
        weight,
        rstd,
        None if dh is None else dh.contiguous(),
        dx,
        partial,
        rows,
        hidden,
        per_program,
        HAS_DH=dh is not None,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        STAGES=stages,
        num_warps=warps,
    )
    return dx, partial.sum(0).to(weight.dtype)


@rms_norm_fwd.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    return x.new_empty(x.shape), x.new_empty(x.shape[0], dtype=torch.float32)


@add_rms_norm_fwd.register_fake
def _(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    rstd = x.new_empty(x.shape[0], dtype=torch.float32)
    return x.new_empty(x.shape), x.new_empty(x.shape), rstd


@rms_norm_bwd.register_fake
def _(
    dy: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    rstd: torch.Tensor,
    dh: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    return x.new_empty(x.shape), weight.new_empty(weight.shape)


def _save_norm(ctx: torch.autograd.function.FunctionCtx, inputs: tuple, output: tuple) -> None:
    ctx.save_for_backward(inputs[0], inputs[1], output[1])


def _norm_backward(
    ctx: Any, dy: torch.Tensor, _drstd: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, None]:
    x, weight, rstd = ctx.saved_tensors
    dx, dw = rms_norm_bwd(dy, x, weight, rstd, None)
    return dx, dw, None


def _save_add_norm(ctx: torch.autograd.function.FunctionCtx, inputs: tuple, output: tuple) -> None:
    ctx.save_for_backward(output[1], inputs[2], output[2])


def _add_norm_backward(
    ctx: Any,
    dy: torch.Tensor,
    dh: torch.Tensor | None,
    _drstd: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, None]:
    h, weight, rstd = ctx.saved_tensors
    dx, dw = rms_norm_bwd(dy, h, weight, rstd, dh)
    return dx, dx, dw, None


_rms_norm = differentiable(rms_norm_fwd, _save_norm, _norm_backward)
_add_rms_norm = differentiable(add_rms_norm_fwd, _save_add_norm, _add_norm_backward)


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Eager PyTorch RMSNorm with fp32 statistics; output in x.dtype."""
    if weight.dtype != x.dtype:  # F.rms_norm wants one dtype: compute in fp32, like the kernel
        return F.rms_norm(x.float(), (x.shape[-1],), weight.float(), eps).to(x.dtype)
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def add_rms_norm_reference(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eager PyTorch (rms_norm(x + residual), x + residual)."""
    h = x + residual
    return rms_norm_reference(h, weight, eps), h


def _check_weight(x: torch.Tensor, weight: torch.Tensor) -> None:
    if weight.shape != (x.shape[-1],):
        raise ValueError(f"weight {tuple(weight.shape)} does not match hidden size {x.shape[-1]}")


def _rows(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1, t.shape[-1]).contiguous()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """RMSNorm over the last dim of x [..., H] with weight [H]; fp32 math, output in x.dtype."""
    _check_weight(x, weight)
    if not on_triton(x, weight):
        return rms_norm_reference(x, weight, eps)
    y, _ = _rms_norm(_rows(x), weight, eps)
    return y.view(x.shape)


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(h), h) with h = x + residual (same shape; h in x.dtype), in one pass."""
    _check_weight(x, weight)
    if x.shape != residual.shape:
        raise ValueError(f"x {tuple(x.shape)} and residual {tuple(residual.shape)} differ")
    if not on_triton(x, residual, weight):
        return add_rms_norm_reference(x, residual, weight, eps)
    y, h, _ = _add_rms_norm(_rows(x), _rows(residual), weight, eps)
    return y.view(x.shape), h.view(x.shape)


class RMSNorm(nn.Module):
    """`torch.nn.RMSNorm` over the last dim (elementwise affine) on the Triton kernel."""

    def __init__(
        self,
        hidden_size: int,
        eps: float = 1e-6,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(hidden_size, device=device, dtype=dtype))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"
