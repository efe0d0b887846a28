"""CPU time per call against GPU time per call: turbo kernels vs the PyTorch ops they replace.

    python tools/bench/launch_overhead.py

Small enough that the GPU finishes before the CPU issues the next call, as in Megatron's layers
at micro batch 1. CPU: wall time of 200 back-to-back calls without synchronising, per call.
GPU: kernel time per call from torch.profiler. Where CPU > GPU, a training step built of such
calls waits on the CPU (docs/benchmarks/e2e.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from primus.turbo.kernels.rms_norm import rms_norm, rms_norm_reference
from primus.turbo.kernels.swiglu import swiglu


def per_call_us(fn: Callable[[], object], calls: int = 200) -> tuple[float, float]:
    """(CPU µs, GPU kernel µs) per call of `fn`."""
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
    gpu = sum(e.self_device_time_total for e in prof.key_averages()) / 20
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    cpu = (time.perf_counter() - start) / calls * 1e6
    torch.cuda.synchronize()
    return cpu, gpu


def forward_backward(
    norm: Callable[..., torch.Tensor], x: torch.Tensor, w: torch.Tensor, dy: torch.Tensor
) -> Callable[[], None]:
    def step() -> None:
        x.grad = w.grad = None
        norm(x, w, 1e-5).backward(dy)

    return step


def main() -> None:
    bf16 = {"device": "cuda", "dtype": torch.bfloat16}
    x = torch.randn(4096, 2048, **bf16, requires_grad=True)
    w = torch.ones(2048, **bf16, requires_grad=True)
    dy = torch.randn_like(x)
    g = torch.randn(4096, 8192, **bf16)
    cases = {
        "turbo rms_norm fwd": lambda: rms_norm(x, w, 1e-5),
        "torch rms_norm fwd": lambda: rms_norm_reference(x, w, 1e-5),
        "turbo rms_norm fwd+bwd": forward_backward(rms_norm, x, w, dy),
        "torch rms_norm fwd+bwd": forward_backward(rms_norm_reference, x, w, dy),
        "turbo swiglu fwd": lambda: swiglu(g, g),
        "torch swiglu fwd": lambda: F.silu(g) * g,
    }
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}\n")
    print("| call | CPU µs | GPU µs |\n|---|---|---|")
    for name, fn in cases.items():
        cpu, gpu = per_call_us(fn)
        print(f"| {name} | {cpu:.0f} | {gpu:.0f} |")


if __name__ == "__main__":
    main()
