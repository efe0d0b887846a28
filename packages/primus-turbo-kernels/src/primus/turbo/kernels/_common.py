"""What every kernel module shares: when Triton runs, launch sizes, the custom-op namespace."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch

OPS = "primus_turbo"  # the namespace of the kernels' ops: torch.ops.primus_turbo.<name>


# Triton decides at `@triton.jit` time whether a kernel is interpreted, so this is read once,
# when the kernels are defined (the first import of primus.turbo.kernels).
_INTERPRETING = os.environ.get("TRITON_INTERPRET", "0") == "1"


def interpreting() -> bool:
    """The kernels were defined under Triton's CPU interpreter (`TRITON_INTERPRET=1`)."""
    return _INTERPRETING


def on_triton(*tensors: torch.Tensor) -> bool:
    """Whether these tensors go to a Triton kernel: on a GPU, or anywhere under the interpreter.

    Elsewhere (CPU without the interpreter) the public functions use their PyTorch reference.
    """
    if interpreting():
        return True
    return all(t.device.type in ("cuda", "xpu") for t in tensors)


def kernel_op(name: str, mutates_args: tuple[str, ...] = ()) -> Callable[[Callable], Any]:
    """Decorator: a function that launches Triton kernels (each through `launch`) as the op
    `primus_turbo::<name>`. On a GPU a `torch.library.triton_op`: torch.compile's Inductor
    traces into it and schedules the kernels in its own graph (buffers reused, no opaque call).
    Under the interpreter a `custom_op`, which torch.compile keeps whole (Inductor cannot
    trace interpreted kernels). Eager calls run the function either way."""
    register = torch.library.custom_op if interpreting() else torch.library.triton_op
    return register(f"{OPS}::{name}", mutates_args=mutates_args)


def launch(kernel: Any) -> Any:
    """`kernel` as a `kernel_op` launches it: traceable by torch.compile inside a triton_op."""
    return torch.library.wrap_triton(kernel)


def row_launch(width: int, itemsize: int) -> tuple[int, int]:
    """(BLOCK, num_warps) for a kernel that holds one row of `width` elements in registers."""
    import triton

    block = triton.next_power_of_2(width)
    if interpreting():
        return block, 1
    nbytes = block * max(itemsize, 2)
    warps = 4 if nbytes <= 8192 else 8 if nbytes <= 32768 else 16
    return block, warps


def eager_impl(op: Any) -> Callable[..., Any]:
    """What the public functions call for a `kernel_op` with no gradient: the op under
    torch.compile, its Python function in eager (no dispatcher round trips)."""
    impl = getattr(op, "_init_fn", None)  # the decorated function (torch >= 2.4)
    if impl is None:
        return op
    return lambda *args: op(*args) if torch.compiler.is_compiling() else impl(*args)


def differentiable(
    op: Any, setup_context: Callable[..., None], backward: Callable[..., Any]
) -> Callable[..., Any]:
    """Register `backward` as `kernel_op` `op`'s autograd formula; return what the public
    functions call: the op itself under torch.compile (no graph break), and
    in eager an autograd.Function over the op's Python function with the same formula. That
    skips the dispatcher's two Python round trips per call, which cost about three times the
    CPU time of the Function, and training makes thousands of these calls per step."""
    op.register_autograd(backward, setup_context=setup_context)
    impl = getattr(op, "_init_fn", None)  # the decorated function (torch >= 2.4)
    if impl is None:
        return op

    def forward(ctx: Any, *args: Any) -> Any:
        output = impl(*args)
        setup_context(ctx, args, output)
        return output

    eager: type[torch.autograd.Function] = type(
        f"{impl.__name__}_function",
        (torch.autograd.Function,),
        {"forward": staticmethod(forward), "backward": staticmethod(backward)},
    )

    def call(*args: Any) -> Any:
        return op(*args) if torch.compiler.is_compiling() else eager.apply(*args)

    return call
