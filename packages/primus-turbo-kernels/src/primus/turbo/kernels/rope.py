"""Rotary position embedding (RoPE): one Triton kernel for Megatron's and TorchTitan's layouts.

`apply_rope(x, cos, sin, seq_dim=..., interleaved=...)` rotates the first R features of the
last (head) dim of `x` and copies the rest. `x` is `[s, b, h, d]` (Megatron, `seq_dim=0`),
`[b, s, h, d]` (TorchTitan, `seq_dim=1`) or `[s, h, d]` (`seq_dim=0`), any strides; `cos` and
`sin` are `[s, R/2]` (fp32, any strides): cosine and sine of pair i's angle at each position,
times any scale such as Megatron's mscale. Pairs are `(i, i + R/2)` (rotate-half) or, with
`interleaved=True`, `(2i, 2i + 1)` (TorchTitan's complex form, Megatron's `rotary_interleaved`):

    y1 = x1 * cos - x2 * sin,    y2 = x2 * cos + x1 * sin

The kernel is the op `primus_turbo::rope(x, cos, sin, seq_dim, interleaved, inverse)`; its
backward is the same op with `inverse` flipped (rotation by -angle), so grads flow to `x` only.
Math is fp32, the output has `x`'s dtype and shape and is contiguous.

`apply_rope_qkv(qkv, cos, sin, head_dim=...)` does query and key of Megatron's unsplit QKV
projection in one launch (op `primus_turbo::rope_qkv`) and returns query, key and value.

`llama3_inv_freq` and `rope_cos_sin` build `cos`/`sin` the way both upstreams do.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import triton
import triton.language as tl
from torch import Tensor

from primus.turbo.kernels._common import differentiable, kernel_op, launch, on_triton, row_launch

# Elements (heads x padded head dim) one program holds in registers.
_TILE = 4096


def llama3_inv_freq(
    dim: int,
    base: float,
    factor: float = 8.0,
    low_freq_factor: float = 1.0,
    high_freq_factor: float = 4.0,
    original_max_position_embeddings: int = 8192,
    device: torch.device | str | None = None,
) -> Tensor:
    """Inverse frequencies `[dim/2]` (fp32) with Llama-3 scaling, as Megatron and TorchTitan do.

    Wavelengths shorter than `original_max_position_embeddings / high_freq_factor` are kept,
    those longer than `.../ low_freq_factor` are divided by `factor`, and the band between is
    interpolated. `factor=1` gives plain RoPE frequencies `base ** (-2i / dim)`.
    """
    freqs = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32, device=device) / dim))
    low_freq_wavelen = original_max_position_embeddings / low_freq_factor
    high_freq_wavelen = original_max_position_embeddings / high_freq_factor
    wavelen = 2 * math.pi / freqs
    scaled = torch.where(wavelen > low_freq_wavelen, freqs / factor, freqs)
    smooth = (original_max_position_embeddings / wavelen - low_freq_factor) / (
        high_freq_factor - low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def rope_cos_sin(positions: int | Tensor, inv_freq: Tensor) -> tuple[Tensor, Tensor]:
    """`(cos, sin)`, each `[s, len(inv_freq)]` fp32, for positions `0..s-1` or the given ones."""
    if isinstance(positions, int):
        positions = torch.arange(positions, device=inv_freq.device)
    angles = torch.outer(positions.to(inv_freq.device, torch.float32), inv_freq.float())
    return angles.cos(), angles.sin()


def apply_rope_reference(
    x: Tensor, cos: Tensor, sin: Tensor, *, seq_dim: int, interleaved: bool = False
) -> Tensor:
    """`apply_rope` in plain PyTorch (fp32 math, output in `x.dtype`)."""
    half = cos.shape[-1]
    shape = [1] * x.ndim
    shape[seq_dim], shape[-1] = cos.shape[0], half
    c, s = cos.float().reshape(shape), sin.float().reshape(shape)
    rot = x[..., : 2 * half].float()
    if interleaved:
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
    else:
        x1, x2 = rot.chunk(2, dim=-1)
    y1, y2 = x1 * c - x2 * s, x2 * c + x1 * s
    y = torch.stack((y1, y2), dim=-1).flatten(-2) if interleaved else torch.cat((y1, y2), dim=-1)
    return torch.cat((y.to(x.dtype), x[..., 2 * half :]), dim=-1)


@triton.jit
def _rope_kernel(
    x_ptr,
    y_ptr,
    cos_ptr,
    sin_ptr,
    batch,
    heads,
    groups,
    x_sb,
    x_ss,
    x_sh,
    y_sb,
    y_ss,
    y_sh,
    cos_ss,
    cos_sk,
    sin_ss,
    sin_sk,
    HALF: tl.constexpr,
    PASS: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_P: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    INVERSE: tl.constexpr,
    QPG: tl.constexpr,
):
    """One program: BLOCK_H heads of one token of a [batch, seq, heads, dim] view. With QPG
    (query heads per group) > 0 the heads are Megatron's QKV: x's groups [q * QPG, k, v] go to
    y as [all q; all k; all v], or back with INVERSE; value heads are copied, not rotated."""
    token = tl.program_id(0).to(tl.int64)
    s = token // batch
    b = token % batch
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    k = tl.arange(0, BLOCK_K)
    h_ok = (h < heads)[:, None]
    k_ok = k < HALF
    cos = tl.load(cos_ptr + s * cos_ss + k * cos_sk, mask=k_ok, other=0.0).to(tl.float32)
    sin = tl.load(sin_ptr + s * sin_ss + k * sin_sk, mask=k_ok, other=0.0).to(tl.float32)
    if INVERSE:
        sin = -sin
    cos = cos[None, :]
    sin = sin[None, :]
    src = h
    if QPG > 0:
        queries = groups * QPG
        if INVERSE:  # y head h is group h // (QPG + 2)'s slot h % (QPG + 2)
            group, slot = h // (QPG + 2), h % (QPG + 2)
            src = tl.where(slot < QPG, group * QPG + slot, queries + (slot - QPG) * groups + group)
        else:  # y head h is a query, a key or a value head
            slot = tl.where(h < queries, h % QPG, QPG + (h - queries) // groups)
            group = tl.where(h < queries, h // QPG, (h - queries) % groups)
            src = group * (QPG + 2) + slot
        rotated = (slot <= QPG)[:, None]
        cos = tl.where(rotated, cos, 1.0)
        sin = tl.where(rotated, sin, 0.0)
    x_row = x_ptr + b * x_sb + s * x_ss + src[:, None] * x_sh
    y_row = y_ptr + b * y_sb + s * y_ss + h[:, None] * y_sh
    if INTERLEAVED:
        # Load the pairs contiguously and split them in registers.
        cols = tl.arange(0, 2 * BLOCK_K)[None, :]
        mask = h_ok & (cols < 2 * HALF)
        pairs = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
        x1, x2 = tl.split(tl.reshape(pairs, (BLOCK_H, BLOCK_K, 2)))
        y = tl.join(x1 * cos - x2 * sin, x2 * cos + x1 * sin)
        y = tl.reshape(y, (BLOCK_H, 2 * BLOCK_K))
        tl.store(y_row + cols, y.to(y_ptr.dtype.element_ty), mask=mask)
    else:
        cols = k[None, :]
        mask = h_ok & k_ok[None, :]
        x1 = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(x_row + cols + HALF, mask=mask, other=0.0).to(tl.float32)
        y1 = x1 * cos - x2 * sin
        y2 = x2 * cos + x1 * sin
        tl.store(y_row + cols, y1.to(y_ptr.dtype.element_ty), mask=mask)
        tl.store(y_row + cols + HALF, y2.to(y_ptr.dtype.element_ty), mask=mask)
    if PASS > 0:
        cols = 2 * HALF + tl.arange(0, BLOCK_P)[None, :]
        mask = h_ok & (cols < 2 * HALF + PASS)
        tl.store(y_row + cols, tl.load(x_row + cols, mask=mask), mask=mask)


def _bshd(t: Tensor, seq_dim: int) -> Tensor:
    """`t` viewed as `[batch, seq, heads, dim]` (no copy)."""
    if t.ndim == 3:
        return t.unsqueeze(0)
    return t.transpose(0, 1) if seq_dim == 0 else t


def _launch(
    x: Tensor,
    cos: Tensor,
    sin: Tensor,
    seq_dim: int,
    interleaved: bool,
    inverse: bool,
    qkv_groups: int = 0,
) -> Tensor:
    if x.stride(-1) != 1:  # every other stride goes to the kernel as is
        x = x.contiguous()
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if y.numel() == 0:
        return y
    xv, yv = _bshd(x, seq_dim), _bshd(y, seq_dim)
    batch, seq, heads, dim = xv.shape
    half = cos.shape[-1]
    passthrough = dim - 2 * half
    block_k = triton.next_power_of_2(half)
    block_p = triton.next_power_of_2(passthrough) if passthrough else 0
    width = triton.next_power_of_2(2 * block_k + block_p)
    block_h = max(1, min(triton.next_power_of_2(heads), _TILE // width))
    _, num_warps = row_launch(block_h * width, x.element_size())
    grid = (seq * batch, triton.cdiv(heads, block_h))
    launch(_rope_kernel)[grid](
        xv,
        yv,
        cos,
        sin,
        batch,
        heads,
        qkv_groups,
        xv.stride(0),
        xv.stride(1),
        xv.stride(2),
        yv.stride(0),
        yv.stride(1),
        yv.stride(2),
        cos.stride(0),
        cos.stride(1),
        sin.stride(0),
        sin.stride(1),
        HALF=half,
        PASS=passthrough,
        BLOCK_H=block_h,
        BLOCK_K=block_k,
        BLOCK_P=block_p,
        INTERLEAVED=interleaved,
        INVERSE=inverse,
        QPG=heads // qkv_groups - 2 if qkv_groups else 0,
        num_warps=num_warps,
    )
    return y


@kernel_op("rope")
def _rope(
    x: Tensor, cos: Tensor, sin: Tensor, seq_dim: int, interleaved: bool, inverse: bool
) -> Tensor:
    """Rotate by the angles of `cos`/`sin`, or by their negatives when `inverse`."""
    if on_triton(x):
        return _launch(x, cos, sin, seq_dim, interleaved, inverse)
    sin = -sin if inverse else sin
    return apply_rope_reference(x, cos, sin, seq_dim=seq_dim, interleaved=interleaved)


@_rope.register_fake
def _(
    x: Tensor, cos: Tensor, sin: Tensor, seq_dim: int, interleaved: bool, inverse: bool
) -> Tensor:
    return x.new_empty(x.shape)


def _transposed(op: Any) -> tuple[Any, Any]:
    """Autograd setup and backward of a rotation op `(x, cos, sin, n, interleaved, inverse)`
    whose gradient is the same op with `inverse` flipped (the transpose of a rotation, and of
    a head permutation, is its inverse), so grads flow to `x` only."""

    def setup_context(ctx: Any, inputs: tuple, output: Tensor) -> None:
        _, cos, sin, ctx.n, ctx.interleaved, ctx.inverse = inputs
        ctx.save_for_backward(cos, sin)

    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        cos, sin = ctx.saved_tensors
        dx = op(grad, cos, sin, ctx.n, ctx.interleaved, not ctx.inverse)
        return dx, None, None, None, None, None

    return setup_context, backward


_rope_differentiable = differentiable(_rope, *_transposed(_rope))


def apply_rope(
    x: Tensor, cos: Tensor, sin: Tensor, *, seq_dim: int, interleaved: bool = False
) -> Tensor:
    """Rotate the first `2 * cos.shape[-1]` features of `x`'s last dim; see the module doc.

    `x`: `[s, b, h, d]` or `[s, h, d]` with `seq_dim=0`, or `[b, s, h, d]` with `seq_dim=1`;
    `cos`, `sin`: `[s, R/2]`, `R <= d`. Differentiable in `x`.
    """
    seq_dim %= x.ndim
    if x.ndim not in (3, 4) or seq_dim > x.ndim - 3:
        raise ValueError(f"x must be [s,b,h,d], [b,s,h,d] or [s,h,d]; got {tuple(x.shape)}")
    if cos.shape != sin.shape or cos.ndim != 2 or cos.shape[0] != x.shape[seq_dim]:
        raise ValueError(
            f"cos and sin must be [{x.shape[seq_dim]}, R/2]; got {tuple(cos.shape)}, "
            f"{tuple(sin.shape)}"
        )
    if not 0 < 2 * cos.shape[1] <= x.shape[-1]:
        raise ValueError(f"rotary dim {2 * cos.shape[1]} must be in (0, {x.shape[-1]}]")
    return _rope_differentiable(x, cos, sin, seq_dim, interleaved, False)


def rope_qkv_reference(
    x: Tensor, cos: Tensor, sin: Tensor, groups: int, interleaved: bool, inverse: bool
) -> Tensor:
    """The `rope_qkv` op in plain PyTorch: QKV heads `[s, b, groups * (q + 2), d]`, grouped
    (each group's q query heads, its key head, its value head) -> `[all q; all k; all v]` with
    queries and keys rotated, or with `inverse` back, rotated by the negative angles."""
    s, b, heads, d = x.shape
    per_group = heads // groups - 2

    def rotate(t: Tensor) -> Tensor:
        return apply_rope_reference(
            t, cos, -sin if inverse else sin, seq_dim=0, interleaved=interleaved
        )

    if inverse:
        q, k, v = x.split([groups * per_group, groups, groups], dim=2)
        grouped = (
            rotate(q).reshape(s, b, groups, per_group, d),
            rotate(k)[:, :, :, None],
            v[:, :, :, None],
        )
        return torch.cat(grouped, dim=3).reshape(s, b, heads, d)
    q, k, v = x.reshape(s, b, groups, per_group + 2, d).split([per_group, 1, 1], dim=3)
    q = q.reshape(s, b, groups * per_group, d)
    return torch.cat((rotate(q), rotate(k[:, :, :, 0]), v[:, :, :, 0]), dim=2)


@kernel_op("rope_qkv")
def _rope_qkv(
    x: Tensor, cos: Tensor, sin: Tensor, groups: int, interleaved: bool, inverse: bool
) -> Tensor:
    """See `rope_qkv_reference`; one launch either way."""
    if on_triton(x):
        return _launch(x, cos, sin, 0, interleaved, inverse, groups)
    return rope_qkv_reference(x, cos, sin, groups, interleaved, inverse)


@_rope_qkv.register_fake
def _(x: Tensor, cos: Tensor, sin: Tensor, groups: int, interleaved: bool, inverse: bool) -> Tensor:
    return x.new_empty(x.shape)


_rope_qkv_differentiable = differentiable(_rope_qkv, *_transposed(_rope_qkv))


def apply_rope_qkv(
    qkv: Tensor, cos: Tensor, sin: Tensor, *, head_dim: int, interleaved: bool = False
) -> tuple[Tensor, Tensor, Tensor]:
    """Megatron's unsplit QKV `[s, b, groups, (q + 2) * head_dim]` (each group: its q query
    heads, its key head, its value head) -> query `[s, b, groups * q, head_dim]`, key and
    value `[s, b, groups, head_dim]`, query and key rotated: one launch forward and one
    backward, where a split and a rope per tensor take three. Views of one output."""
    if qkv.ndim != 4 or qkv.shape[-1] % head_dim or qkv.shape[-1] // head_dim < 3:
        raise ValueError(
            f"qkv must be [s, b, groups, (q + 2) * {head_dim}] with q >= 1; got {tuple(qkv.shape)}"
        )
    if cos.shape != sin.shape or cos.ndim != 2 or cos.shape[0] != qkv.shape[0]:
        raise ValueError(f"cos and sin must be [{qkv.shape[0]}, R/2]; got {tuple(cos.shape)}")
    if not 0 < 2 * cos.shape[1] <= head_dim:
        raise ValueError(f"rotary dim {2 * cos.shape[1]} must be in (0, {head_dim}]")
    s, b, groups, width = qkv.shape
    heads = groups * (width // head_dim)
    y = _rope_qkv_differentiable(
        qkv.reshape(s, b, heads, head_dim), cos, sin, groups, interleaved, False
    )
    query, key, value = y.split([heads - 2 * groups, groups, groups], dim=2)
    return query, key, value
