"""FP8 linear layers through `torch._scaled_mm` alone (no Transformer Engine, no torchao).

`fp8_linear(x, weight, bias, recipe)` is `F.linear` whose three GEMMs (output, input gradient,
weight gradient) run on FP8 tensor cores. Every GEMM is written `A @ B.T` with A [M, K] and
B [N, K] both row-major in FP8, quantized along K, which is the layout `_scaled_mm` takes
(`B.t()` is column-major). Quantization (scales and the cast) is `fp8_cast`'s.

- `tensorwise`: one scale per tensor, current scaling (the amax of this call); inputs and
  weights in e4m3, output gradients in e5m2. The forward also writes the transposed FP8
  copies of the input and the weight, which the backward's GEMMs take.
- `delayed`: `tensorwise` with delayed scaling for the input and the output gradient (the
  largest amax of the layer's last calls, recorded by the casts: no amax pass); the weight
  keeps current scaling, cast once per optimizer step. Eager or CUDA graphs, not
  `torch.compile` (its state lives outside the graph).
- `rowwise`: one scale per row of A and per row of B (`_scaled_mm`'s [M, 1] and [1, N]
  scales); everything in e4m3, as torchao's row-wise recipe (per-row scales cover the range,
  e4m3 keeps a mantissa bit more); output bf16 only. Each GEMM quantizes its own operands
  along its own K.

Compiled, the weight's copies are made in the graph, not cached. `_scaled_mm` also runs on the
CPU in recent torch (row-wise scales too in 2.15, not in 2.11), which the tests use. GEMMs
need K and N (and, for the weight gradient, M) to be multiples of 16: `fp8_supported` says
whether a shape is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.optim.optimizer import register_optimizer_step_post_hook

from primus.turbo.kernels.fp8_cast import E4M3, E5M2, AmaxHistory, quantize_both, quantize_rows

RECIPES = ("tensorwise", "rowwise", "delayed")
GRAD_DTYPE = {"tensorwise": E5M2, "rowwise": E4M3, "delayed": E5M2}


def mm_nt(
    a: torch.Tensor, scale_a: torch.Tensor, b: torch.Tensor, scale_b: torch.Tensor, dtype: Any
) -> torch.Tensor:
    """`(a * scale_a) @ (b * scale_b).T` in `dtype` for FP8 a [M, K] and b [N, K], both
    row-major; scales one-element (tensorwise) or per row ([M, 1], [N, 1]: rowwise)."""
    if scale_b.dim():
        scale_b = scale_b.reshape(1, -1)
    return torch._scaled_mm(a, b.t(), scale_a=scale_a, scale_b=scale_b, out_dtype=dtype)


def fp8_supported(x: torch.Tensor, weight: torch.Tensor, recipe: str) -> bool:
    """Whether `fp8_linear` runs this input [..., K] and weight [N, K] in FP8: every GEMM
    dimension a multiple of 16, and bf16 for the row-wise recipe (its only output dtype)."""
    tokens = x.numel() // max(x.shape[-1], 1)
    dims_ok = all(d % 16 == 0 and d > 0 for d in (tokens, *weight.shape))
    dtype_ok = x.dtype == torch.bfloat16 if recipe == "rowwise" else x.is_floating_point()
    return dims_ok and dtype_ok and weight.dtype == x.dtype


# Weight copies are kept for one optimizer step: every optimizer step bumps the generation.
_generation = [0]
_hooked = [False]


def _next_generation(*_: Any) -> None:
    _generation[0] += 1


def _weight_copies(weight: torch.Tensor, recipe: str) -> tuple[torch.Tensor, ...]:
    """(W [N, K], its scale) for the forward, and for the backward W.T [K, N] and its scale
    (same scale tensorwise, current scaling in both tensor-wise recipes; column amax
    rowwise)."""
    if recipe != "rowwise":
        w, w_t, scale = quantize_both(weight, E4M3)
        return w, scale, w_t, scale
    return (*quantize_rows(weight, E4M3, True), *quantize_rows(weight.t(), E4M3, True))


def _weight_fp8(weight: torch.Tensor, recipe: str, cache: bool) -> tuple[torch.Tensor, ...]:
    """`_weight_copies` of `weight`, cached on it with `cache` until the next optimizer step
    (any `torch.optim` step) or an in-place change of the weight; never under `torch.compile`,
    which makes them in its graph. A copy made outside a CUDA graph's capture is not reused
    inside one, nor the other way round: a graph that read an eager copy would replay that
    step's weights for good (and a copy made while capturing holds data only once the graph
    replays)."""
    if not cache or torch.compiler.is_compiling():
        return _weight_copies(weight.detach(), recipe)
    capturing = weight.is_cuda and torch.cuda.is_current_stream_capturing()
    key = (_generation[0], weight._version, recipe, capturing)
    held = getattr(weight, "_turbo_fp8", None)
    if held is not None and held[0] == key:
        return held[1]
    copies = _weight_copies(weight.detach(), recipe)
    if not _hooked[0]:
        register_optimizer_step_post_hook(_next_generation)
        _hooked[0] = True
    weight._turbo_fp8 = (key, copies)  # type: ignore[attr-defined]
    return copies


def _histories(weight: torch.Tensor, device: torch.device) -> tuple[AmaxHistory, ...]:
    """The delayed recipe's amax histories of the layer of `weight`: its input's and its
    output gradient's, made at the first call."""
    if torch.compiler.is_compiling():
        raise RuntimeError("the delayed FP8 recipe keeps its amax history outside torch.compile")
    held = getattr(weight, "_turbo_amax", None)
    if held is None:
        held = weight._turbo_amax = (AmaxHistory(device), AmaxHistory(device))  # type: ignore[attr-defined]
    return held


@dataclass
class Saved:
    """What the backward needs: FP8 copies tensorwise, the input itself rowwise."""

    recipe: str
    x: torch.Tensor  # tensorwise: x.T in FP8 [K, M]; rowwise: x [M, K] as given (a caller
    # may keep a slice of it instead, as the sequence-parallel layers do)
    x_scale: torch.Tensor  # tensorwise: x's scale; rowwise: unused (empty)
    w_t: torch.Tensor  # W.T in FP8 [K, N]
    w_t_scale: torch.Tensor
    grad_history: AmaxHistory | None = None  # the delayed recipe's, for the output gradient


@dataclass
class GradFP8:
    """The output gradient's FP8 copies: G [M, N] for the input gradient, G.T [N, M] for the
    weight gradient, each with its scale."""

    g: torch.Tensor
    g_scale: torch.Tensor
    g_t: torch.Tensor
    g_t_scale: torch.Tensor


def fp8_forward(
    x: torch.Tensor, weight: torch.Tensor, recipe: str, cache: bool = False
) -> tuple[torch.Tensor, Saved]:
    """`x @ weight.T` for x [M, K] in FP8 (output in x's dtype), and what the backward needs."""
    w, w_scale, w_t, w_t_scale = _weight_fp8(weight, recipe, cache)
    if recipe == "rowwise":
        q, x_scale = quantize_rows(x, E4M3, True)
        saved = Saved(recipe, x, x_scale.new_empty(0), w_t, w_t_scale)
    else:
        x_history, grad_history = (
            _histories(weight, x.device) if recipe == "delayed" else (None, None)
        )
        q, q_t, x_scale = quantize_both(x, E4M3, x_history)
        saved = Saved(recipe, q_t, x_scale, w_t, w_t_scale, grad_history)
    return mm_nt(q, x_scale, w, w_scale, x.dtype), saved


def quantize_grad(saved: Saved, grad: torch.Tensor) -> GradFP8:
    """The output gradient [M, N] of `fp8_forward` in FP8, as the recipe scales it."""
    dtype = GRAD_DTYPE[saved.recipe]
    if saved.recipe == "rowwise":
        return GradFP8(*quantize_rows(grad, dtype, True), *quantize_rows(grad.t(), dtype, True))
    g, g_t, scale = quantize_both(grad, dtype, saved.grad_history)
    return GradFP8(g, scale, g_t, scale)


def input_grad(saved: Saved, grad: GradFP8, dtype: torch.dtype) -> torch.Tensor:
    """The input gradient [M, K] in `dtype`."""
    return mm_nt(grad.g, grad.g_scale, saved.w_t, saved.w_t_scale, dtype)


def weight_grad(saved: Saved, grad: GradFP8, dtype: torch.dtype) -> torch.Tensor:
    """The weight gradient [N, K] in `dtype` (bf16 rowwise: the row-wise kernel's only
    output)."""
    if saved.recipe == "rowwise":
        x_t, x_scale = quantize_rows(saved.x.t(), E4M3, True)
        dtype = torch.bfloat16
    else:
        x_t, x_scale = saved.x, saved.x_scale
    return mm_nt(grad.g_t, grad.g_t_scale, x_t, x_scale, dtype)


def fp8_backward(
    saved: Saved, grad: torch.Tensor, wgrad_dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """(input gradient [M, K] in grad's dtype, weight gradient [N, K] in `wgrad_dtype`) of
    `fp8_forward` from the output gradient [M, N]."""
    quantized = quantize_grad(saved, grad)
    return input_grad(saved, quantized, grad.dtype), weight_grad(saved, quantized, wgrad_dtype)


def function_forward(
    ctx: Any,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    recipe: str,
    cache: bool,
) -> torch.Tensor:
    """An autograd Function's forward over `fp8_forward`: x of any leading shape, the bias
    added; `ctx` keeps what `fp8_backward` needs (`saved`), `shape` and `has_bias`."""
    out, ctx.saved = fp8_forward(x.reshape(-1, x.shape[-1]), weight, recipe, cache)
    ctx.has_bias, ctx.shape = bias is not None, x.shape
    out = out.view(*x.shape[:-1], weight.shape[0])
    return out if bias is None else out + bias


class FP8Linear(torch.autograd.Function):
    """`F.linear` with its three GEMMs in FP8 (see the module docstring)."""

    forward = staticmethod(function_forward)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        grad = grad.reshape(-1, grad.shape[-1])
        grad_input, grad_weight = fp8_backward(ctx.saved, grad, grad.dtype)
        grad_bias = grad.sum(0) if ctx.has_bias else None
        return grad_input.view(ctx.shape), grad_weight, grad_bias, None, None


def fp8_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    recipe: str = "tensorwise",
    cache_weight: bool = False,
) -> torch.Tensor:
    """`F.linear(x, weight, bias)` with FP8 GEMMs forward and backward; shapes or dtypes FP8
    cannot take (`fp8_supported`) run `F.linear`. `cache_weight` keeps the weight's FP8 copies
    until the next `torch.optim` step (for weights that only optimizers change)."""
    if recipe not in RECIPES:
        raise ValueError(f"FP8 recipe must be one of {RECIPES}, got {recipe!r}")
    if not fp8_supported(x, weight, recipe):
        return F.linear(x, weight, bias)
    return FP8Linear.apply(x, weight, bias, recipe, cache_weight)


def fp8_linear_reference(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """What `fp8_linear` approximates."""
    return F.linear(x, weight, bias)
