"""`primus benchmark gemm`: the GEMMs a job runs, timed on this device (docs/operations.md).

The shapes come from an experiment (its model and parallel layout, as the memory projection
sees them: one GPU's share of each layer's matrices for one micro batch) or are given.
Timing: warm-up calls first; then each repeat on its own, between CUDA events on a GPU with
the L2 cache flushed before it (a 256 MiB buffer zeroed, outside the timed region), or the
wall clock on the CPU; the median and the spread of the repeats. torch is imported only here.
"""

from __future__ import annotations

import re
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any

from primus.core.errors import ConfigError
from primus.core.metrics import peak_tflops
from primus.core.projection import Job

L2_FLUSH_BYTES = 256 << 20  # larger than any GPU's L2 (H100: 50 MiB, MI300X: 256 MiB of MALL)
DTYPES = ("bf16", "fp16", "fp32")


@dataclass(frozen=True)
class Gemm:
    """`[m, k] @ [k, n]`, named after what it computes."""

    name: str
    m: int
    n: int
    k: int

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k


def parse_shape(text: str) -> Gemm:
    """`MxNxK` (`4096x8192x2048`) as a GEMM; a ConfigError otherwise."""
    match = re.fullmatch(r"(\d+)x(\d+)x(\d+)", text.strip())
    if not match or 0 in (dims := tuple(int(d) for d in match.groups())):
        raise ConfigError(f"--shape '{text}' is not MxNxK with positive sizes (4096x8192x2048)")
    return Gemm(text, *dims)


def job_gemms(job: Job) -> list[Gemm]:
    """One GPU's forward GEMMs of one micro batch: each layer's four (the QKV projection, the
    attention output, the MLP's up (gate and up together) and down), then the logits."""
    m = job.model
    tokens = job.micro_batch * job.seq_len // job.cp
    q, kv = m.heads * m.head_dim, m.kv_heads * m.head_dim
    up = (2 if m.gated else 1) * m.ffn
    return [
        Gemm("qkv", tokens, (q + 2 * kv) // job.tp, m.hidden),
        Gemm("attention_out", tokens, m.hidden, q // job.tp),
        Gemm("mlp_up", tokens, up // job.tp, m.hidden),
        Gemm("mlp_down", tokens, m.hidden, m.ffn // job.tp),
        Gemm("logits", tokens, m.vocab // job.tp, m.hidden),
    ]


@dataclass(frozen=True)
class Timing:
    gemm: Gemm
    median_ms: float
    min_ms: float
    max_ms: float
    tflops: float  # at the median
    peak_pct: float | None  # of the device's dense peak (bf16/fp16 only)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self) | {"flops": self.gemm.flops}


def timed(torch: Any, cuda: bool, fn: Callable[[], Any], repeats: int, warmup: int) -> list[float]:
    """Milliseconds of each of `repeats` calls of `fn`, after `warmup` calls; on a GPU each
    between CUDA events, with the L2 cache flushed before it."""
    for _ in range(warmup):
        fn()
    if not cuda:
        times = []
        for _ in range(repeats):
            began = time.perf_counter()
            fn()
            times.append((time.perf_counter() - began) * 1e3)
        return times
    flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    events = [
        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        for _ in range(repeats)
    ]
    for start, end in events:
        flush.zero_()
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return [start.elapsed_time(end) for start, end in events]


def run_gemms(gemms: list[Gemm], dtype: str, repeats: int, warmup: int) -> tuple[str, list[Timing]]:
    """Time each GEMM on this process's device (the GPU if there is one); the device's name
    and a timing each."""
    import torch

    cuda = torch.cuda.is_available()
    device = torch.cuda.get_device_name() if cuda else "cpu"
    torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
    peak = peak_tflops(device) if cuda and dtype != "fp32" else None
    results = []
    for gemm in gemms:
        a = torch.randn(gemm.m, gemm.k, dtype=torch_dtype, device="cuda" if cuda else "cpu")
        b = torch.randn(gemm.k, gemm.n, dtype=torch_dtype, device=a.device)
        times = timed(torch, cuda, partial(torch.matmul, a, b), repeats, warmup)
        median = statistics.median(times)
        tflops = gemm.flops / (median / 1e3) / 1e12
        pct = 100 * tflops / peak if peak else None
        results.append(Timing(gemm, median, min(times), max(times), tflops, pct))
    return device, results


def render(device: str, dtype: str, timings: list[Timing]) -> str:
    """A table: each GEMM's shape, median time and spread, TFLOP/s and % of the peak."""
    lines = [
        f"device {device}, {dtype}",
        f"{'gemm':<16} {'m x n x k':<22} {'median ms':>10} {'spread':>8} {'TFLOP/s':>9} "
        f"{'% peak':>7}",
    ]
    for t in timings:
        g = t.gemm
        spread = f"{100 * (t.max_ms - t.min_ms) / t.median_ms:.0f}%"
        pct = f"{t.peak_pct:.1f}" if t.peak_pct is not None else "n/a"
        shape = f"{g.m}x{g.n}x{g.k}"
        tflops = f"{t.tflops:.1f}" if t.tflops >= 1 else f"{t.tflops:.3g}"
        lines.append(
            f"{g.name:<16} {shape:<22} {t.median_ms:>10.3f} {spread:>8} {tflops:>9} {pct:>7}"
        )
    return "\n".join(lines) + "\n"
