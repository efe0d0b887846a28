"""SwiGLU: silu(gate) * up, with silu in fp32, for separate halves or Megatron's packed fc1
output x [..., 2F] (gate = first half, up = second half), read and written in place through
row strides, without splitting or concatenating the halves.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from primus.turbo.kernels._common import differentiable, kernel_op, launch, on_triton, row_launch

# A program covers BLOCK_M x BLOCK_N elements: up to this many columns of as many rows as fit
# in _TILE elements; programs run along the rows first, so memory is streamed in order.
_BLOCK_N = 256
_TILE = 4096


@triton.jit
def _tile_offsets(M, N, stride, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """(offsets into the halves [M, N] with row `stride`, offsets into a contiguous [M, N],
    mask) of this program's tile."""
    pid = tl.program_id(0)
    col_blocks = tl.cdiv(N, BLOCK_N)
    rows = (pid // col_blocks) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = (pid % col_blocks) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    rows = rows.to(tl.int64)[:, None]
    return rows * stride + cols[None, :], rows * N + cols[None, :], mask


@triton.jit
def _fwd_kernel(g_ptr, u_ptr, y_ptr, M, N, stride, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    offs, out_offs, mask = _tile_offsets(M, N, stride, BLOCK_M, BLOCK_N)
    g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    y = g * tl.sigmoid(g) * u
    tl.store(y_ptr + out_offs, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _bwd_kernel(
    dy_ptr,
    g_ptr,
    u_ptr,
    dg_ptr,
    du_ptr,
    M,
    N,
    stride,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    offs, out_offs, mask = _tile_offsets(M, N, stride, BLOCK_M, BLOCK_N)
    dy = tl.load(dy_ptr + out_offs, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    sig = tl.sigmoid(g)
    silu = g * sig
    dg = dy * u * (sig + silu * (1.0 - sig))
    tl.store(dg_ptr + offs, dg.to(dg_ptr.dtype.element_ty), mask=mask)
    tl.store(du_ptr + offs, (dy * silu).to(du_ptr.dtype.element_ty), mask=mask)


def _launch(rows: int, cols: int, itemsize: int) -> tuple[tuple[int], dict[str, int]]:
    """(grid, launch options) for tiles over [rows, cols]."""
    block_n = min(triton.next_power_of_2(max(cols, 1)), _BLOCK_N)
    block_m = min(_TILE // block_n, triton.next_power_of_2(max(rows, 1)))
    _, warps = row_launch(block_m * block_n, itemsize)
    grid = (triton.cdiv(rows, block_m) * triton.cdiv(cols, block_n),)
    return grid, {"BLOCK_M": block_m, "BLOCK_N": block_n, "num_warps": warps}


def _forward(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for halves [rows, F] sharing one row stride (last stride 1)."""
    rows, cols = gate.shape
    y = gate.new_empty(rows, cols)
    grid, opts = _launch(rows, cols, gate.element_size())
    launch(_fwd_kernel)[grid](gate, up, y, rows, cols, gate.stride(0), **opts)
    return y


def _backward(
    dy: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, dgate: torch.Tensor, dup: torch.Tensor
) -> None:
    """Fill dgate, dup (the strides of gate and up) from dy [rows, F] contiguous."""
    rows, cols = gate.shape
    grid, opts = _launch(rows, cols, gate.element_size())
    launch(_bwd_kernel)[grid](dy, gate, up, dgate, dup, rows, cols, gate.stride(0), **opts)


@kernel_op("swiglu_fwd")
def swiglu_fwd(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for gate, up [rows, F]."""
    return _forward(gate.contiguous(), up.contiguous())


@kernel_op("swiglu_bwd")
def swiglu_bwd(
    dy: torch.Tensor, gate: torch.Tensor, up: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(dgate, dup) for y = swiglu(gate, up), all [rows, F]."""
    gate, up = gate.contiguous(), up.contiguous()
    dgate, dup = torch.empty_like(gate), torch.empty_like(up)
    _backward(dy.contiguous(), gate, up, dgate, dup)
    return dgate, dup


@kernel_op("swiglu_packed_fwd")
def swiglu_packed_fwd(x: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up [rows, F] for x = [gate | up] [rows, 2F]."""
    x = x.contiguous()
    half = x.shape[1] // 2
    return _forward(x[:, :half], x[:, half:])


@kernel_op("swiglu_packed_bwd")
def swiglu_packed_bwd(dy: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """dx = [dgate | dup] [rows, 2F] for y = swiglu_packed(x)."""
    x = x.contiguous()
    half = x.shape[1] // 2
    dx = torch.empty_like(x)
    _backward(dy.contiguous(), x[:, :half], x[:, half:], dx[:, :half], dx[:, half:])
    return dx


@swiglu_fwd.register_fake
def _(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return gate.new_empty(gate.shape)


@swiglu_bwd.register_fake
def _(dy: torch.Tensor, gate: torch.Tensor, up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return gate.new_empty(gate.shape), up.new_empty(up.shape)


@swiglu_packed_fwd.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape[0], x.shape[1] // 2)


@swiglu_packed_bwd.register_fake
def _(dy: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape)


def _save_inputs(ctx: torch.autograd.function.FunctionCtx, inputs: tuple, output: object) -> None:
    ctx.save_for_backward(*inputs)


def _swiglu_backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return swiglu_bwd(dy, *ctx.saved_tensors)


def _packed_backward(ctx: Any, dy: torch.Tensor) -> torch.Tensor:
    return swiglu_packed_bwd(dy, *ctx.saved_tensors)


_swiglu = differentiable(swiglu_fwd, _save_inputs, _swiglu_backward)
_swiglu_packed = differentiable(swiglu_packed_fwd, _save_inputs, _packed_backward)


def swiglu_reference(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """Eager PyTorch silu(gate) * up."""
    return F.silu(gate) * up


def swiglu_packed_reference(x: torch.Tensor) -> torch.Tensor:
    """Eager PyTorch SwiGLU of Megatron's fc1 output: gate, up = chunk(x, 2, -1)."""
    gate, up = torch.chunk(x, 2, dim=-1)
    return F.silu(gate) * up


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for gate, up [..., F] of one dtype; silu in fp32."""
    if gate.shape != up.shape:
        raise ValueError(f"gate {tuple(gate.shape)} and up {tuple(up.shape)} differ")
    if not on_triton(gate, up):
        return swiglu_reference(gate, up)
    cols = gate.shape[-1]
    y = _swiglu(gate.reshape(-1, cols).contiguous(), up.reshape(-1, cols).contiguous())
    return y.view(gate.shape)


def swiglu_packed(x: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up [..., F] for x = [gate | up] [..., 2F] (Megatron's fc1 layout)."""
    if x.shape[-1] % 2:
        raise ValueError(f"the last dim of x ({x.shape[-1]}) is not even")
    if not on_triton(x):
        return swiglu_packed_reference(x)
    y = _swiglu_packed(x.reshape(-1, x.shape[-1]).contiguous())
    return y.view(*x.shape[:-1], x.shape[-1] // 2)
