"""FP8 in Megatron's local linear layers (imports megatron: load only from a patch handler).

`tag_linears` marks the weights of the Column/RowParallelLinear layers inside every
TransformerLayer but the first and the last (`weight.turbo_fp8 = recipe`); the replaced
`linear_with_grad_accumulation_and_async_allreduce` runs marked weights in FP8 and hands
everything else (unmarked weights, deferred embedding gradients, shapes FP8 cannot take) to
the upstream function.

Under sequence parallelism a column-parallel layer gets its rank's slice of the sequence: the
forward all-gathers it (in the input's dtype, as upstream does) before the FP8 GEMM, and the
backward reduce-scatters the input gradient back to the slice. The tensor-wise recipe keeps
the gathered input's FP8 copy for the weight gradient; the row-wise one keeps the slice and
gathers it again in the backward, as upstream keeps its input.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from megatron.core.tensor_parallel import layers
from megatron.core.utils import get_tensor_model_parallel_group_if_none

from primus.turbo.kernels.fp8_linear import (
    fp8_supported,
    function_forward,
    input_grad,
    quantize_grad,
    weight_grad,
)

UPSTREAM_LINEAR = layers.linear_with_grad_accumulation_and_async_allreduce


def gathered(x: torch.Tensor, group: Any, async_op: bool = False) -> tuple[torch.Tensor, Any]:
    """The slices of `x` of every rank of `group`, concatenated along the first dimension,
    and the collective's handle (to wait on before reading it, with `async_op`)."""
    out = x.new_empty((group.size() * x.shape[0], *x.shape[1:]))
    work = torch.distributed.all_gather_into_tensor(
        out, x.contiguous(), group=group, async_op=async_op
    )
    return out, work


def reduce_scattered(
    x: torch.Tensor, group: Any, async_op: bool = False
) -> tuple[torch.Tensor, Any]:
    """This rank's slice (along the first dimension) of `x` summed over `group`, and the
    collective's handle (to wait on before reading it, with `async_op`)."""
    out = x.new_empty((x.shape[0] // group.size(), *x.shape[1:]))
    work = torch.distributed.reduce_scatter_tensor(
        out, x.contiguous(), group=group, async_op=async_op
    )
    return out, work


def tag_linears(init: Callable[..., None], recipe: str) -> Callable[..., None]:
    """`TransformerLayer.__init__` that marks its linear layers' weights for FP8, unless the
    layer is the model's first or last (`layer_number` counts from 1 over the whole model)."""

    def __init__(self: Any, config: Any, *args: Any, **kwargs: Any) -> None:
        init(self, config, *args, **kwargs)
        if not 1 < self.layer_number < config.num_layers:
            return
        for module in self.modules():
            linear = isinstance(module, (layers.ColumnParallelLinear, layers.RowParallelLinear))
            if linear and module.weight is not None:
                module.weight.turbo_fp8 = recipe

    return __init__


class MegatronFP8Linear(torch.autograd.Function):
    """Megatron's linear autograd function on FP8 GEMMs: the weight gradient goes into
    `main_grad` under gradient-accumulation fusion, as upstream's does, and the input gradient
    is all-reduced (or, under sequence parallelism, reduce-scattered) over the tensor-parallel
    group where upstream does."""

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        recipe: str,
        accumulate: bool,
        allreduce_dgrad: bool,
        sequence_parallel: bool,
        tp_group: Any,
    ) -> torch.Tensor:
        ctx.weight, ctx.accumulate = weight, accumulate
        ctx.allreduce_dgrad, ctx.sequence_parallel = allreduce_dgrad, sequence_parallel
        ctx.tp_group = tp_group
        total = gathered(x, tp_group)[0] if sequence_parallel else x
        out = function_forward(ctx, total, weight, bias, recipe, cache=True)
        if sequence_parallel and recipe == "rowwise":
            ctx.saved.x = x  # the slice: gathered again in the backward
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        """As upstream overlaps them: the row-wise recipe's gather of the input runs under the
        input gradient's GEMM, and the input gradient's all-reduce or reduce-scatter under
        the weight gradient's GEMM."""
        weight, saved = ctx.weight, ctx.saved
        grad = grad.reshape(-1, grad.shape[-1])
        main_grad = getattr(weight, "main_grad", None) if ctx.accumulate else None
        wgrad_dtype = weight.dtype if main_grad is None else main_grad.dtype
        gather = None
        if ctx.sequence_parallel and saved.recipe == "rowwise":  # a copy: the slice stays saved
            whole, gather = gathered(saved.x, ctx.tp_group, async_op=True)
        quantized = quantize_grad(saved, grad)
        grad_input = input_grad(saved, quantized, grad.dtype).view(ctx.shape)
        reduce = None
        if ctx.allreduce_dgrad:
            reduce = torch.distributed.all_reduce(grad_input, group=ctx.tp_group, async_op=True)
        summed = grad_input
        if ctx.sequence_parallel:
            summed, reduce = reduce_scattered(grad_input, ctx.tp_group, async_op=True)
        if gather is not None:
            gather.wait()
            saved = dataclasses.replace(saved, x=whole.reshape(-1, whole.shape[-1]))
        grad_weight = weight_grad(saved, quantized, wgrad_dtype)
        if main_grad is not None:
            main_grad.add_(grad_weight)
        grad_bias = grad.sum(0) if ctx.has_bias else None
        returned = grad_weight if main_grad is None else _accumulated(weight, main_grad, grad.dtype)
        if reduce is not None:
            reduce.wait()
        return summed, returned, grad_bias, None, None, None, None, None


def _accumulated(weight: Any, main_grad: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
    """What upstream returns as the weight's gradient once it went into `main_grad`: a dummy
    that Megatron's DDP hook skips (`grad_added_to_main_grad`), or nothing."""
    if not hasattr(weight, "grad_added_to_main_grad"):
        return None
    make = torch.zeros if getattr(weight, "zero_out_wgrad", False) else torch.empty
    weight.grad_added_to_main_grad = True
    return make(main_grad.shape, dtype=dtype, device=main_grad.device)


def turbo_linear(
    input: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    gradient_accumulation_fusion: bool,
    allreduce_dgrad: bool,
    sequence_parallel: bool,
    grad_output_buffer: list[torch.Tensor] | None = None,
    wgrad_deferral_limit: int | None = 0,
    tp_group: Any = None,
    gtp_remat_size: int = 1,
) -> torch.Tensor:
    """`linear_with_grad_accumulation_and_async_allreduce` in FP8 for the weights
    `tag_linears` marked; the upstream function for the rest."""
    recipe = getattr(weight, "turbo_fp8", None)
    if (
        recipe is None
        or grad_output_buffer is not None
        or gtp_remat_size > 1
        or not fp8_supported(input, weight, recipe)
    ):
        return UPSTREAM_LINEAR(
            input, weight, bias, gradient_accumulation_fusion, allreduce_dgrad,
            sequence_parallel, grad_output_buffer, wgrad_deferral_limit, tp_group, gtp_remat_size,
        )  # fmt: skip
    if allreduce_dgrad or sequence_parallel:
        tp_group = get_tensor_model_parallel_group_if_none(tp_group)
    return MegatronFP8Linear.apply(
        input, weight, bias, recipe, gradient_accumulation_fusion, allreduce_dgrad,
        sequence_parallel, tp_group,
    )  # fmt: skip


# Upstream's function reads this flag by its module-level name, which now names this one.
turbo_linear.warned = False  # type: ignore[attr-defined]
