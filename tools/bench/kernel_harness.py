"""The kernel benchmark's harness: timers, one provider on one case, the comparison of outputs,
and the rates and speedups of each row."""

from __future__ import annotations

import gc
import math
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch
from kernel_cases import BF16, DTYPE, KERNELS, Inputs, Kernel, NotApplicable, Shape

PROVIDERS = ("turbo", "eager", "compile", "liger")
MISMATCH = 0.05  # max abs diff / max abs of the compared output above which a row is flagged

Step = Callable[[], Any]
Timer = Callable[[Step], tuple[float, float | None]]  # (ms, GPU kernel ms or None)


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
