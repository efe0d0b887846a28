"""Per-kernel benchmark of primus-turbo-kernels vs PyTorch eager, torch.compile and liger-kernel.

    pip install --no-deps .whl/liger_kernel-0.8.5-py3-none-any.whl   # the liger column
    python tools/bench/bench_kernels.py --out docs/benchmarks/kernels-h100.json

One process, one GPU, bf16 inputs. First the device-copy bandwidth (`dst.copy_(src)` of 1 GiB,
bytes read + written). Then, per case, each provider: `turbo` (ours), `eager` (the module's
PyTorch reference, called in bf16), `compile` (`torch.compile` of that reference, static shapes,
compiled before timing) and `liger` (liger-kernel's autograd Function, where it has one). A case
is a kernel, a mode (`fwd`; `bwd`: the backward alone, graph retained; `fwd+bwd`) and a shape.

Time: `ms` is `triton.testing.do_bench`, the median over reps of CUDA-event times, the L2 cache
flushed before each rep, gradients reset to None; where the GPU outruns the CPU it is launch
overhead. `GPU ms` is the sum of the step's kernel times from torch.profiler (L2 flushed between
steps, the flush subtracted): the rates and speedups use it. Memory-bound kernels report GB/s with every tensor
counted once each way (as the kernel's `traffic` says) and that as a fraction of the copy
bandwidth; attention and linear cross-entropy report TFLOP/s. Each provider's outputs (forward
results, then gradients) are compared with turbo's (turbo's with eager's): max abs diff and
`MISMATCH` when it passes 5% of the output's largest magnitude, so a wrong layout shows. Prints
a Markdown table per kernel and the issue's targets, and writes JSON with the environment.

On a CPU, tiny sizes, every code path, Triton kernels (ours and liger's) through
`TRITON_INTERPRET=1`, which `--device cpu` sets:

    python tools/bench/bench_kernels.py --device cpu --quick --out /tmp/kernels.json
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import math
import os
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
import torch.nn.functional as F
from common import environment, print_table

DTYPE = torch.bfloat16  # of every input but labels and cos/sin
BF16, FP32, INT64 = 2, 4, 8
PROVIDERS = ("turbo", "eager", "compile", "liger")
EPS = 1e-6
IGNORE = -100
CE_KWARGS = {"ignore_index": IGNORE, "label_smoothing": 0.0, "reduction": "mean"}
MISMATCH = 0.05  # max abs diff / max abs of the compared output above which a row is flagged
TARGET_ELEMENTS = 16 * 2**20  # the copy-bandwidth targets hold from 16M elements

Shape = tuple[Any, ...]
Inputs = tuple[tuple[Any, ...], dict[str, Any]]  # (args, kwargs) of one call
Step = Callable[[], Any]
Timer = Callable[[Step], tuple[float, float | None]]  # (ms, GPU kernel ms or None)


class NotApplicable(Exception):
    """The provider has no counterpart for this case."""


@dataclass(frozen=True)
class Kernel:
    """How to build one kernel's inputs, its providers, and what one call moves or computes."""

    turbo: Callable[[], Callable[..., Any]]
    reference: Callable[[], Callable[..., Any]]
    make: Callable[[Shape, torch.device], Inputs]
    grad_args: tuple[int, ...]  # positions of the args that get gradients
    modes: tuple[str, ...]
    shapes: tuple[Shape, ...]
    quick: tuple[Shape, ...]
    liger: Callable[[ModuleType], Callable[..., Any]] | None = None
    traffic: Callable[[Shape, str], int] | None = None  # bytes, each tensor once each way
    flops: Callable[[Shape, str], float] | None = None
    label: Callable[[Shape], str] = lambda shape: str(list(shape))
    copy_targets: dict[str, float] = field(default_factory=dict)  # mode: min of copy BW
    liger_targets: dict[str, float] = field(default_factory=dict)  # mode: min speedup
    note: str = ""


@dataclass
class Row:
    """One provider on one case: what the table and the JSON show."""

    kernel: str
    case: str
    mode: str
    shape: Shape
    provider: str
    ms: float | None = None
    gpu_ms: float | None = None  # the kernels' own time (profiler); rates use it when known
    gbps: float | None = None
    copy_fraction: float | None = None
    tflops: float | None = None
    vs_compile: float | None = None  # compile's time / this time
    vs_liger: float | None = None  # liger's time / this time
    max_abs_diff: float | None = None  # vs turbo; turbo's own vs eager
    check: str | None = None
    note: str | None = None  # why n/a, or the error


# --- providers ------------------------------------------------------------------------------


def ours(module: str, name: str) -> Callable[[], Callable[..., Any]]:
    """A loader of `primus.turbo.kernels.<module>.<name>` (imported when the case runs)."""
    return lambda: getattr(importlib.import_module(f"primus.turbo.kernels.{module}"), name)


def liger_rope(ops: ModuleType) -> Callable[..., torch.Tensor]:
    """`apply_rope` on `LigerRopeFunction`, which rotates q [b, h, s, d] and k in place in
    [b, s, h, d] storage (rotate-half only); k is a 1-head dummy here."""

    def rope(
        x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, seq_dim: int, interleaved: bool
    ) -> torch.Tensor:
        if interleaved:
            raise NotApplicable("liger's RoPE is rotate-half only")
        order = (1 - seq_dim, 2, seq_dim, 3)  # [s, b, h, d] or [b, s, h, d] -> [b, h, s, d]
        q = x.permute(order)
        k = q.new_zeros(q.shape[0], 1, *q.shape[2:])
        out, _ = ops.LigerRopeFunction.apply(q, k, cos, sin, None, 1, 2 * cos.shape[-1])
        return out.permute(sorted(range(4), key=order.__getitem__))

    return rope


def liger_cross_entropy(ops: ModuleType) -> Callable[..., torch.Tensor]:
    def cross_entropy(
        logits: torch.Tensor, labels: torch.Tensor, *, ignore_index: int,
        label_smoothing: float, reduction: str,
    ) -> torch.Tensor:  # fmt: skip
        return ops.LigerCrossEntropyFunction.apply(
            logits, labels, None, ignore_index, 0.0, label_smoothing, reduction
        )[0]

    return cross_entropy


def liger_linear_cross_entropy(ops: ModuleType) -> Callable[..., torch.Tensor]:
    def linear_cross_entropy(
        hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, *, ignore_index: int,
        label_smoothing: float, reduction: str,
    ) -> torch.Tensor:  # fmt: skip
        return ops.LigerFusedLinearCrossEntropyFunction.apply(
            hidden, weight, labels, None, None, ignore_index, 0.0, label_smoothing, reduction
        )[0]

    return linear_cross_entropy


def sdpa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """What the turbo patch makes Megatron's core attention: SDPA, causal, grouped KV heads."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


def attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Megatron's unfused DotProductAttention: KV heads repeated, softmax(QK^T * scale + causal
    mask) V, all in the inputs' dtype (bf16)."""
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    scores = torch.matmul(q, k.transpose(-2, -1)) * q.shape[-1] ** -0.5
    s = q.shape[-2]
    causal = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1)
    probs = torch.softmax(scores.masked_fill(causal, -10000.0), dim=-1)
    return torch.matmul(probs, v)


# --- inputs ---------------------------------------------------------------------------------


def randn(*shape: int, device: torch.device, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, device=device) * scale).to(DTYPE)


def labels(n: int, vocab: int, device: torch.device) -> torch.Tensor:
    """Targets in [0, vocab), about one in 16 set to the ignore index."""
    out = torch.randint(0, vocab, (n,), device=device)
    return out.masked_fill(torch.rand(n, device=device) < 1 / 16, IGNORE)


def rms_norm_inputs(shape: Shape, device: torch.device) -> Inputs:
    m, n = shape
    return (randn(m, n, device=device), 1 + randn(n, device=device, scale=0.1), EPS), {}


def add_rms_norm_inputs(shape: Shape, device: torch.device) -> Inputs:
    (x, weight, eps), _ = rms_norm_inputs(shape, device)
    return (x, randn(*shape, device=device), weight, eps), {}


def swiglu_inputs(shape: Shape, device: torch.device) -> Inputs:
    return (randn(*shape, device=device), randn(*shape, device=device)), {}


def packed_inputs(shape: Shape, device: torch.device) -> Inputs:
    return (randn(*shape, device=device),), {}


def rope_inputs(shape: Shape, device: torch.device) -> Inputs:
    """shape: (layout "sbhd"/"bshd", dims in that order, interleaved); cos/sin [s, d/2] fp32."""
    layout, dims, interleaved = shape
    s, d = dims[layout.index("s")], dims[-1]
    inv_freq = 10000.0 ** -(torch.arange(0, d, 2, device=device, dtype=torch.float32) / d)
    angles = torch.outer(torch.arange(s, device=device, dtype=torch.float32), inv_freq)
    x = randn(*dims, device=device)
    return (x, angles.cos(), angles.sin()), {
        "seq_dim": layout.index("s"),
        "interleaved": interleaved,
    }


def cross_entropy_inputs(shape: Shape, device: torch.device) -> Inputs:
    n, vocab = shape
    return (randn(n, vocab, device=device), labels(n, vocab, device)), dict(CE_KWARGS)


def linear_cross_entropy_inputs(shape: Shape, device: torch.device) -> Inputs:
    n, hidden, vocab = shape
    h, w = randn(n, hidden, device=device), randn(vocab, hidden, device=device, scale=hidden**-0.5)
    return (h, w, labels(n, vocab, device)), dict(CE_KWARGS)


def attention_inputs(shape: Shape, device: torch.device) -> Inputs:
    b, heads, kv_heads, s, d = shape
    q = randn(b, heads, s, d, device=device)
    return (q, randn(b, kv_heads, s, d, device=device), randn(b, kv_heads, s, d, device=device)), {}


# --- bytes and FLOPs per call ---------------------------------------------------------------


def rms_norm_traffic(shape: Shape, mode: str) -> int:
    """fwd: read x, w; write y. bwd: read x, dy, w, rstd; write dx, dw."""
    m, n = shape
    if mode == "fwd":
        return 2 * m * n * BF16 + n * BF16
    return 3 * m * n * BF16 + 2 * n * BF16 + m * FP32


def add_rms_norm_traffic(shape: Shape, mode: str) -> int:
    """fwd: read x, residual, w; write y, h. bwd: read h, dy, dh, w, rstd; write dx (the grad
    of x and of residual alike), dw."""
    m, n = shape
    if mode == "fwd":
        return 4 * m * n * BF16 + n * BF16
    return 4 * m * n * BF16 + 2 * n * BF16 + m * FP32


def glu_traffic(elements: int, mode: str) -> int:
    """fwd: read gate, up; write out. bwd: read gate, up, dout; write dgate, dup."""
    return (3 if mode == "fwd" else 5) * elements * BF16


def rope_traffic(shape: Shape, mode: str) -> int:
    """fwd and bwd alike: read x (dy), cos, sin; write y (dx)."""
    layout, dims, _ = shape
    return 2 * math.prod(dims) * BF16 + 2 * dims[layout.index("s")] * (dims[-1] // 2) * FP32


def cross_entropy_traffic(shape: Shape, mode: str) -> int:
    """fwd: read logits, labels. fwd+bwd: read logits, labels; write dlogits."""
    n, vocab = shape
    return (1 if mode == "fwd" else 2) * n * vocab * BF16 + n * INT64


def linear_cross_entropy_flops(shape: Shape, mode: str) -> float:
    """Model FLOPs: logits 2NHV, then dhidden and dweight 2NHV each (recompute not counted)."""
    n, hidden, vocab = shape
    return 2.0 * n * hidden * vocab * (1 if mode == "fwd" else 3)


def attention_flops(shape: Shape, mode: str) -> float:
    """Causal: 4 b h s^2 d / 2 forward, 2.5 times that backward."""
    b, heads, _, s, d = shape
    return 4.0 * b * heads * s * s * d / 2 * (1 if mode == "fwd" else 2.5)


# --- the cases ------------------------------------------------------------------------------

KERNELS: dict[str, Kernel] = {
    "rms_norm": Kernel(
        turbo=ours("rms_norm", "rms_norm"),
        reference=ours("rms_norm", "rms_norm_reference"),
        make=rms_norm_inputs,
        grad_args=(0, 1),
        modes=("fwd", "bwd"),
        shapes=((4096, 2048), (4096, 4096), (8192, 2048), (16384, 8192)),
        quick=((64, 256), (33, 1000)),
        liger=lambda ops: (
            lambda x, w, eps: ops.LigerRMSNormFunction.apply(x, w, eps, 0.0, "llama", False)
        ),
        traffic=rms_norm_traffic,
        copy_targets={"fwd": 0.85, "bwd": 0.70},
        note="liger: LigerRMSNormFunction(x, w, eps, offset=0, casting_mode='llama', "
        "in_place=False). [4096, 2048] is Llama-3.2-1B's.",
    ),
    "add_rms_norm": Kernel(
        turbo=ours("rms_norm", "add_rms_norm"),
        reference=ours("rms_norm", "add_rms_norm_reference"),
        make=add_rms_norm_inputs,
        grad_args=(0, 1, 2),
        modes=("fwd", "bwd"),
        shapes=((4096, 2048), (4096, 4096), (16384, 8192)),
        quick=((64, 256),),
        liger=lambda ops: (
            lambda x, r, w, eps: ops.LigerFusedAddRMSNormFunction.apply(
                x, r, w, eps, 0.0, "llama", False
            )
        ),
        traffic=add_rms_norm_traffic,
        note="(y, h) = (rms_norm(x + residual), x + residual). liger: "
        "LigerFusedAddRMSNormFunction(x, residual, w, eps, 0, 'llama', in_place=False).",
    ),
    "swiglu": Kernel(
        turbo=ours("swiglu", "swiglu"),
        reference=ours("swiglu", "swiglu_reference"),
        make=swiglu_inputs,
        grad_args=(0, 1),
        modes=("fwd", "bwd"),
        shapes=((4096, 8192), (8192, 8192)),
        quick=((64, 256),),
        liger=lambda ops: ops.LigerSiLUMulFunction.apply,
        traffic=lambda shape, mode: glu_traffic(math.prod(shape), mode),
        copy_targets={"fwd": 0.85, "bwd": 0.70},
        note="silu(gate) * up, shape = gate's = up's; [4096, 8192] is Llama-3.2-1B's. "
        "liger: LigerSiLUMulFunction(gate, up) (its backward writes the grads into gate and up).",
    ),
    "swiglu_packed": Kernel(
        turbo=ours("swiglu", "swiglu_packed"),
        reference=ours("swiglu", "swiglu_packed_reference"),
        make=packed_inputs,
        grad_args=(0,),
        modes=("fwd", "bwd"),
        shapes=((4096, 16384), (8192, 16384)),
        quick=((64, 512),),
        liger=lambda ops: lambda x: ops.LigerFusedGateUpSiLUMulFunction.apply(x, False),
        traffic=lambda shape, mode: glu_traffic(math.prod(shape) // 2, mode),
        copy_targets={"fwd": 0.85, "bwd": 0.70},
        note="x = [gate | up] on the last dim (Megatron's linear_fc1 output), shape = x's. "
        "liger: LigerFusedGateUpSiLUMulFunction(x, in_place=False).",
    ),
    "rope": Kernel(
        turbo=ours("rope", "apply_rope"),
        reference=ours("rope", "apply_rope_reference"),
        make=rope_inputs,
        grad_args=(0,),
        modes=("fwd", "bwd"),
        shapes=(
            ("sbhd", (4096, 1, 32, 64), False),
            ("bshd", (2, 4096, 32, 128), False),
            ("sbhd", (4096, 1, 32, 64), True),
        ),
        quick=(
            ("sbhd", (16, 1, 4, 32), False),
            ("sbhd", (16, 2, 4, 32), False),
            ("bshd", (2, 16, 4, 64), False),
            ("bshd", (2, 16, 4, 32), True),
        ),
        liger=liger_rope,
        traffic=rope_traffic,
        label=lambda shape: f"{shape[0]} {list(shape[1])}" + (" interleaved" if shape[2] else ""),
        note="x [s, b, h, d] (Megatron) or [b, s, h, d] (TorchTitan), cos/sin [s, d/2] fp32. "
        "liger: LigerRopeFunction(q, k, cos, sin, None, 1, rotary_dim=d) on q = x viewed as "
        "[b, h, s, d] (no copy for bshd, nor for sbhd with b = 1) and a 1-head dummy k "
        "(+1/h of its traffic); it rotates in place; interleaved: n/a.",
    ),
    "cross_entropy": Kernel(
        turbo=ours("cross_entropy", "cross_entropy"),
        reference=ours("cross_entropy", "cross_entropy_reference"),
        make=cross_entropy_inputs,
        grad_args=(0,),
        modes=("fwd", "fwd+bwd"),
        shapes=((4096, 128256), (8192, 128256)),
        quick=((32, 1000), (16, 5000)),
        liger=liger_cross_entropy,
        traffic=cross_entropy_traffic,
        liger_targets={"fwd+bwd": 2.0},
        note="logits [N, V] bf16, mean over labels, 1/16 ignored. liger: "
        "LigerCrossEntropyFunction (writes the logits' grad into the logits during forward).",
    ),
    "linear_cross_entropy": Kernel(
        turbo=ours("linear_cross_entropy", "linear_cross_entropy"),
        reference=ours("linear_cross_entropy", "linear_cross_entropy_reference"),
        make=linear_cross_entropy_inputs,
        grad_args=(0, 1),
        modes=("fwd+bwd",),
        shapes=((4096, 2048, 128256), (8192, 2048, 128256)),
        quick=((32, 64, 1000),),
        liger=liger_linear_cross_entropy,
        flops=linear_cross_entropy_flops,
        label=lambda shape: "[N={}, H={}, V={}]".format(*shape),
        note="loss of hidden [N, H] @ weight[V, H]^T; eager = matmul + cross-entropy. liger: "
        "LigerFusedLinearCrossEntropyFunction (grads computed in forward, grad_weight "
        "accumulated in bf16: accum_dtype=None, its default).",
    ),
    "attention": Kernel(
        turbo=lambda: sdpa_attention,
        reference=lambda: attention_reference,
        make=attention_inputs,
        grad_args=(0, 1, 2),
        modes=("fwd", "bwd"),
        shapes=((1, 32, 8, 4096, 64),),
        quick=((1, 4, 2, 64, 32),),
        flops=attention_flops,
        label=lambda shape: "[b={}, h={}, kv_heads={}, s={}, d={}]".format(*shape),
        note="turbo = torch SDPA(is_causal, enable_gqa), what the turbo patch makes Megatron's "
        "core attention; eager = Megatron's unfused DotProductAttention in bf16.",
    ),
}


# --- measuring ------------------------------------------------------------------------------


def make_timer(device: torch.device, warmup: int, rep: int) -> tuple[Timer, str]:
    """The timer for `device` and how it measures."""
    if device.type == "cuda":
        from triton.testing import do_bench

        def cuda_time(step: Step) -> tuple[float, float]:
            return do_bench(step, warmup=warmup, rep=rep, return_mode="median"), kernel_ms(step)

        how = (
            f"ms: triton.testing.do_bench, median of CUDA-event times, L2 flushed before each "
            f"rep, warmup {warmup} ms, rep {rep} ms (includes launch overhead when the GPU "
            "waits for the CPU); GPU ms: sum of the step's kernel times (torch.profiler), "
            "L2 flushed between steps; rates and speedups use GPU ms"
        )
        return cuda_time, how

    def wall_clock(step: Step) -> tuple[float, None]:
        step()
        times = []
        for _ in range(3):
            start = time.perf_counter()
            step()
            times.append(time.perf_counter() - start)
        return statistics.median(times) * 1e3, None

    return wall_clock, "wall clock, median of 3 after one warm-up (CPU check only)"


def kernel_ms(step: Step, reps: int = 20) -> float:
    """Mean GPU kernel time of one step (torch.profiler), the L2 flushed before each step and
    the flush's own time subtracted: what the kernels cost, without launch overhead."""
    flush = torch.empty(256 * 2**20, dtype=torch.int8, device="cuda")

    def per_rep(with_step: bool) -> float:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(reps):
                flush.zero_()
                if with_step:
                    step()
            torch.cuda.synchronize()
        return sum(e.self_device_time_total for e in prof.key_averages()) / 1e3 / reps

    return max(per_rep(True) - per_rep(False), 1e-6)


def copy_bandwidth(device: torch.device, nbytes: int, timer: Timer) -> float:
    """GB/s of `dst.copy_(src)` over `nbytes` of bf16, counting the read and the write."""
    src = torch.ones(nbytes // BF16, dtype=DTYPE, device=device)
    dst = torch.empty_like(src)
    ms, gpu_ms = timer(lambda: dst.copy_(src))
    return 2 * nbytes / (gpu_ms or ms) / 1e6


def as_tuple(out: Any) -> tuple[torch.Tensor, ...]:
    return out if isinstance(out, tuple) else (out,)


def output_grads(outputs: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
    """Seeded upstream grads: ones for a scalar loss, randn otherwise, contiguous whatever the
    output's strides (randn_like would put the same values at other positions)."""
    torch.manual_seed(1)
    return [
        torch.randn(t.shape, dtype=t.dtype, device=t.device) if t.ndim else torch.ones_like(t)
        for t in outputs
    ]


def prepare(
    fn: Callable[..., Any], inputs: Inputs, mode: str, grad_args: tuple[int, ...]
) -> tuple[Step, tuple[torch.Tensor, ...]]:
    """(the step to time, the outputs of one step: forward results, then grads). Runs the step
    once, which also compiles."""
    args, kwargs = inputs
    if mode == "fwd":
        return lambda: fn(*args, **kwargs), as_tuple(fn(*args, **kwargs))
    leaves = [args[i].requires_grad_() for i in grad_args]
    outputs = as_tuple(fn(*args, **kwargs))
    dys = output_grads(outputs)

    def backward(outs: tuple[torch.Tensor, ...]) -> None:
        for leaf in leaves:  # no accumulation; liger's grads can be views of its inputs
            leaf.grad = None
        torch.autograd.backward(outs, dys, retain_graph=mode == "bwd")

    backward(outputs)
    grads = tuple(leaf.grad for leaf in leaves)
    if mode == "bwd":
        return lambda: backward(outputs), grads
    step = lambda: backward(as_tuple(fn(*args, **kwargs)))  # noqa: E731
    return step, tuple(t.detach() for t in outputs) + grads


def provider_fn(kernel: Kernel, provider: str, liger: ModuleType | str) -> Callable[..., Any]:
    if provider == "turbo":
        return kernel.turbo()
    if provider == "eager":
        return kernel.reference()
    if provider == "compile":
        return torch.compile(kernel.reference(), dynamic=False)
    if kernel.liger is None:
        raise NotApplicable("no liger-kernel counterpart")
    if isinstance(liger, str):
        raise NotApplicable(liger)
    return kernel.liger(liger)


def measure(
    fn: Callable[..., Any], kernel: Kernel, mode: str, shape: Shape, device: torch.device,
    timer: Timer,
) -> tuple[float, float | None, tuple[torch.Tensor, ...]]:  # fmt: skip
    """(ms, GPU ms, the outputs of one step), on fresh seeded inputs."""
    torch.manual_seed(0)
    step, outputs = prepare(fn, kernel.make(shape, device), mode, kernel.grad_args)
    # Copied before timing: liger writes grads into its inputs and activations in place.
    outputs = tuple(t.detach().clone() for t in outputs)
    return (*timer(step), outputs)


def compare(
    outputs: tuple[torch.Tensor, ...], baseline: tuple[torch.Tensor, ...]
) -> tuple[float, str]:
    """(max abs diff over all outputs, "ok" or "MISMATCH")."""
    if [t.shape for t in outputs] != [t.shape for t in baseline]:
        return math.inf, "MISMATCH"
    worst, flagged = 0.0, False
    for out, ref in zip(outputs, baseline, strict=True):
        diff = (out.float() - ref.float()).abs().max().item() if out.numel() else 0.0
        diff = diff if math.isfinite(diff) else math.inf
        worst = max(worst, diff)
        flagged |= diff > MISMATCH * max(ref.float().abs().max().item() if ref.numel() else 0, 1e-6)
    return worst, "MISMATCH" if flagged else "ok"


def run_case(
    name: str, mode: str, shape: Shape, device: torch.device, timer: Timer,
    liger: ModuleType | str, copy_gbps: float,
) -> list[Row]:  # fmt: skip
    """Every provider on one case; diffs against the first that ran (turbo, else eager)."""
    kernel = KERNELS[name]
    torch._dynamo.reset()  # static shapes for each case, never the recompile limit
    rows, baseline = [], None
    for provider in PROVIDERS:
        row = Row(name, f"{mode} {kernel.label(shape)}", mode, shape, provider)
        rows.append(row)
        try:
            row.ms, row.gpu_ms, outputs = measure(
                provider_fn(kernel, provider, liger), kernel, mode, shape, device, timer
            )
        except NotApplicable as reason:
            row.note = f"n/a: {reason}"
            continue
        except Exception as error:
            print(f"{name} {row.case} {provider}:", file=sys.stderr)
            traceback.print_exc()
            row.note = f"error: {type(error).__name__}: {str(error).splitlines()[0][:300]}"
            continue
        finally:
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
        if baseline is None:
            baseline, baseline_row = outputs, row
            continue
        row.max_abs_diff, row.check = compare(outputs, baseline)
        if baseline_row.check is None:
            baseline_row.max_abs_diff, baseline_row.check = row.max_abs_diff, row.check
    add_rates(kernel, rows, copy_gbps)
    return rows


def add_rates(kernel: Kernel, rows: list[Row], copy_gbps: float) -> None:
    """GB/s (and of copy BW) or TFLOP/s of each timed row, its speedups over compile and liger."""
    ms = {row.provider: row.gpu_ms or row.ms for row in rows}
    for row in rows:
        t = ms[row.provider]
        if t is None:
            continue
        if kernel.traffic is not None:
            row.gbps = kernel.traffic(row.shape, row.mode) / t / 1e6
            row.copy_fraction = row.gbps / copy_gbps
        if kernel.flops is not None:
            row.tflops = kernel.flops(row.shape, row.mode) / t / 1e9
        row.vs_compile = ms["compile"] / t if ms["compile"] else None
        row.vs_liger = ms["liger"] / t if ms["liger"] else None


def targets(rows: list[Row]) -> list[dict[str, Any]]:
    """The issue's targets, judged on turbo's rows: at least as fast as compile everywhere;
    the kernel's fraction of copy bandwidth from 16M elements; its speedup over liger."""
    checks = []
    for row in rows:
        if row.provider != "turbo" or row.ms is None:
            continue
        kernel = KERNELS[row.kernel]
        wanted = [("speedup vs compile", row.vs_compile, 1.0)]
        if row.mode in kernel.copy_targets and math.prod(row.shape) >= TARGET_ELEMENTS:
            wanted.append(("fraction of copy BW", row.copy_fraction, kernel.copy_targets[row.mode]))
        if row.mode in kernel.liger_targets:
            wanted.append(("speedup vs liger", row.vs_liger, kernel.liger_targets[row.mode]))
        checks += [
            {"kernel": row.kernel, "case": row.case, "what": what, "value": value,
             "target": target, "met": None if value is None else value >= target}
            for what, value, target in wanted
        ]  # fmt: skip
    return checks


# --- report ---------------------------------------------------------------------------------

COLUMNS = (
    ("ms", "ms", ".4f"),
    ("GPU ms", "gpu_ms", ".4f"),
    ("GB/s", "gbps", ",.0f"),
    ("of copy BW", "copy_fraction", ".0%"),
    ("TFLOP/s", "tflops", ".1f"),
    ("x compile", "vs_compile", ".2f"),
    ("x liger", "vs_liger", ".2f"),
    ("max abs diff", "max_abs_diff", ".2e"),
    ("check", "check", "s"),
)


def print_report(rows: list[Row], checks: list[dict[str, Any]]) -> None:
    for name, kernel in KERNELS.items():
        mine = [row for row in rows if row.kernel == name]
        if not mine:
            continue
        print(f"\n### {name}\n")
        summary = {f"{row.case} {row.provider}": asdict(row) for row in mine}
        notes = [kernel.note] + [f"{r.case} {r.provider}: {r.note}" for r in mine if r.note]
        print_table(summary, COLUMNS, "\n".join(f"- {note}" for note in notes))
    print("\n### targets (turbo)\n")
    for c in checks:
        met = {True: "met", False: "NOT MET", None: "not measured"}[c["met"]]
        value = "n/a" if c["value"] is None else f"{c['value']:.2f}"
        print(f"- {met}: {c['kernel']} {c['case']}: {c['what']} {value} (target >= {c['target']})")


def load_liger() -> ModuleType | str:
    """liger_kernel.ops, or why it is not there."""
    try:
        return importlib.import_module("liger_kernel.ops")
    except ImportError as error:
        return f"liger-kernel not importable ({error})"


def installed(distribution: str) -> bool:
    try:
        metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return False
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="write the JSON report here")
    parser.add_argument(
        "--kernels",
        default=",".join(KERNELS),
        help=f"comma-separated subset of {','.join(KERNELS)}",
    )
    parser.add_argument("--quick", action="store_true", help="tiny sizes: checks the code paths")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--warmup", type=int, default=25, help="do_bench warmup, ms")
    parser.add_argument("--rep", type=int, default=100, help="do_bench repetition time, ms")
    opts = parser.parse_args()
    names = opts.kernels.split(",")
    if unknown := set(names) - set(KERNELS):
        parser.error(f"unknown kernels {sorted(unknown)}; choose from {list(KERNELS)}")
    device = torch.device(opts.device)
    if device.type == "cpu":  # read when Triton kernels are defined, i.e. imported below
        os.environ["TRITON_INTERPRET"] = "1"
    liger = load_liger()
    timer, timing = make_timer(device, opts.warmup, opts.rep)

    copy_bytes = 2**24 if opts.quick else 2**30
    copy_gbps = copy_bandwidth(device, copy_bytes, timer)
    print(f"timing: {timing}")
    print(f"device copy bandwidth: {copy_gbps:,.0f} GB/s ({copy_bytes >> 20} MiB, read + write)")
    rows: list[Row] = []
    start = time.perf_counter()
    for name in names:
        kernel = KERNELS[name]
        for mode in kernel.modes:
            for shape in kernel.quick if opts.quick else kernel.shapes:
                rows += run_case(name, mode, shape, device, timer, liger, copy_gbps)
                elapsed = time.perf_counter() - start
                print(f"[{elapsed:.0f} s] {name} {rows[-1].case}", file=sys.stderr, flush=True)
    checks = targets(rows)
    print_report(rows, checks)

    dists = ("torch", "triton", "primus-turbo-kernels", "liger-kernel")
    device_name = None if device.type == "cuda" else f"cpu ({os.cpu_count()} cores)"
    report = {
        **environment(tuple(d for d in dists if installed(d)), device_name),
        "timing": timing,
        "quick": opts.quick,
        "liger": liger if isinstance(liger, str) else "liger_kernel.ops",
        "copy": {"bytes": copy_bytes, "gbps": copy_gbps},
        "rows": [asdict(row) for row in rows],
        "targets": checks,
    }
    if opts.out:
        opts.out.parent.mkdir(parents=True, exist_ok=True)
        opts.out.write_text(json.dumps(report, indent=2) + "\n")
        print(f"\nwrote {opts.out}")
    failed = [row for row in rows if row.note and row.note.startswith("error")]
    if failed:
        print(f"{len(failed)} provider runs failed (see the notes)", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
