"""`primus benchmark gemm|attention`: the GEMMs and the attention a job runs, timed on this
device (docs/operations.md).

The shapes come from an experiment (its model and parallel layout, as the memory projection
sees them: one GPU's share of a layer for one micro batch) or are given.
Timing: warm-up calls first; then each repeat on its own, between CUDA events on a GPU with
the L2 cache flushed before it (a 256 MiB buffer zeroed, outside the timed region), or the
wall clock on the CPU; the median and the spread of the repeats. torch is imported only here.
"""

from __future__ import annotations

import re
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any

from primus.core.errors import ConfigError
from primus.core.launch.dist_env import DistEnv, get_torchrun_env
from primus.core.metrics import peak_tflops
from primus.core.projection import Job
from primus.core.sizes import parse_bytes

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

    @property
    def shape(self) -> str:
        return f"{self.m}x{self.n}x{self.k}"

    @property
    def elements(self) -> int:
        """The inputs' and the output's."""
        return self.m * self.k + self.k * self.n + self.m * self.n

    def call(self, torch: Any, device: str, dtype: Any) -> Callable[[], Any]:
        a = torch.randn(self.m, self.k, dtype=dtype, device=device)
        b = torch.randn(self.k, self.n, dtype=dtype, device=device)
        return partial(torch.matmul, a, b)


@dataclass(frozen=True)
class Attention:
    """Causal scaled-dot-product attention (torch's SDPA, the fastest kernel it picks), forward:
    `batch` sequences of `seq` tokens, `heads` query and `kv_heads` key/value heads."""

    name: str
    batch: int
    heads: int
    kv_heads: int
    seq: int
    head_dim: int

    @property
    def flops(self) -> int:
        """QK^T and PV, half of each under the causal mask."""
        return 2 * self.batch * self.heads * self.seq**2 * self.head_dim

    @property
    def shape(self) -> str:
        return f"{self.batch}x{self.heads}x{self.kv_heads}x{self.seq}x{self.head_dim}"

    @property
    def elements(self) -> int:
        """Query, key, value and the output's."""
        return 2 * self.batch * (self.heads + self.kv_heads) * self.seq * self.head_dim

    def call(self, torch: Any, device: str, dtype: Any) -> Callable[[], Any]:
        def tensor(heads: int) -> Any:
            return torch.randn(
                self.batch, heads, self.seq, self.head_dim, dtype=dtype, device=device
            )

        q, k, v = tensor(self.heads), tensor(self.kv_heads), tensor(self.kv_heads)
        sdpa = torch.nn.functional.scaled_dot_product_attention
        return partial(sdpa, q, k, v, is_causal=True, enable_gqa=self.heads != self.kv_heads)


Op = Gemm | Attention


def parse_shape(text: str) -> Gemm:
    """`MxNxK` (`4096x8192x2048`) as a GEMM; a ConfigError otherwise."""
    m, n, k = _sizes(text, 3, "MxNxK", "4096x8192x2048")
    return Gemm(text, m, n, k)


def parse_attention(text: str) -> Attention:
    """`BxHxKVxSxD` (batch, heads, KV heads, sequence, head dim) as an attention."""
    b, h, kv, seq, d = _sizes(text, 5, "BxHxKVxSxD", "1x32x8x4096x64")
    if h % kv:
        raise ConfigError(f"--shape '{text}': {h} heads do not share {kv} KV heads evenly")
    return Attention(text, b, h, kv, seq, d)


def _sizes(text: str, count: int, form: str, example: str) -> tuple[int, ...]:
    sizes = tuple(int(d) for d in re.findall(r"\d+", text))
    if not re.fullmatch(r"\d+(x\d+)*", text.strip(), re.ASCII) or len(sizes) != count or 0 in sizes:
        raise ConfigError(f"--shape '{text}' is not {form} with positive sizes ({example})")
    return sizes


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


def job_attention(job: Job) -> Attention:
    """One GPU's attention of one micro batch (its heads; context parallelism as a shorter
    sequence, which leaves out the ring's exchanges)."""
    m = job.model
    seq = job.seq_len // job.cp
    return Attention("attention", job.micro_batch, m.heads // job.tp, max(1, m.kv_heads // job.tp),
                     seq, m.head_dim)  # fmt: skip


@dataclass(frozen=True)
class Timing:
    op: Op
    median_ms: float
    min_ms: float
    max_ms: float
    tflops: float  # at the median
    peak_pct: float | None  # of the device's dense peak (bf16/fp16 only)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self) | {"flops": self.op.flops}


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


def check_fits(ops: list[Op], dtype: str, itemsize: int, device: str, free: int | None) -> None:
    """A ConfigError naming the first op whose tensors (`itemsize` bytes an element) need more
    than the device's `free` bytes (None: unknown, no check)."""
    for op in ops:
        need = op.elements * itemsize + (L2_FLUSH_BYTES if device != "cpu" else 0)
        if free is not None and need > free:
            what = op.shape if op.name == op.shape else f"{op.name} ({op.shape})"
            raise ConfigError(
                f"{what}: its {dtype} tensors need {need / 2**30:.1f} GiB, and {device} has "
                f"{free / 2**30:.1f} GiB free",
                hint="time a smaller shape",
            )


def free_bytes(torch: Any, cuda: bool) -> int | None:
    """The GPU's free memory, or the host's available memory on the CPU (None: unknown)."""
    if cuda:
        return int(torch.cuda.mem_get_info()[0])
    from primus.core.diagnostics.host import meminfo_bytes

    return meminfo_bytes("MemAvailable")


def run_ops(ops: list[Op], dtype: str, repeats: int, warmup: int) -> tuple[str, list[Timing]]:
    """Time each op on this process's device (the GPU if there is one); the device's name
    and a timing each. Ops whose tensors the device cannot hold are refused first."""
    import torch

    cuda = torch.cuda.is_available()
    device = torch.cuda.get_device_name() if cuda else "cpu"
    torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
    check_fits(ops, dtype, torch_dtype.itemsize, device, free_bytes(torch, cuda))
    peak = peak_tflops(device) if cuda and dtype != "fp32" else None
    results = []
    for op in ops:
        call = op.call(torch, "cuda" if cuda else "cpu", torch_dtype)
        times = timed(torch, cuda, call, repeats, warmup)
        median = statistics.median(times)
        tflops = op.flops / (median / 1e3) / 1e12
        pct = 100 * tflops / peak if peak else None
        results.append(Timing(op, median, min(times), max(times), tflops, pct))
    return device, results


def render(device: str, dtype: str, timings: list[Timing]) -> str:
    """A table: each op's shape, median time and spread, TFLOP/s and % of the peak."""
    lines = [
        f"device {device}, {dtype}",
        f"{'op':<16} {'shape':<24} {'median ms':>10} {'spread':>8} {'TFLOP/s':>9} {'% peak':>7}",
    ]
    for t in timings:
        spread = f"{100 * (t.max_ms - t.min_ms) / t.median_ms:.0f}%"
        pct = f"{t.peak_pct:.1f}" if t.peak_pct is not None else "n/a"
        tflops = f"{t.tflops:.1f}" if t.tflops >= 1 else f"{t.tflops:.3g}"
        lines.append(
            f"{t.op.name:<16} {t.op.shape:<24} {t.median_ms:>10.3f} {spread:>8} {tflops:>9} "
            f"{pct:>7}"
        )
    return "\n".join(lines) + "\n"


# -- collectives -------------------------------------------------------------------------------

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")


def parse_size(text: str) -> int:
    """`64MiB`, `4m`, `1GiB`, `65536` as bytes (a multiple of 4: float32 elements)."""
    nbytes = parse_bytes(text)
    if not nbytes:
        raise ConfigError(f"--size '{text}' is not a size such as 64MiB, 4m or 65536")
    if nbytes % 4:
        raise ConfigError(f"--size '{text}' is not a whole number of float32 elements")
    return nbytes


def check_messages_fit(sizes: dict[str, int], ranks: int, device: str, free: int | None) -> None:
    """A ConfigError naming the first message whose tensors (the whole and one rank's part)
    need more than the `free` bytes a rank has (None: unknown, no check)."""
    for name, nbytes in sizes.items():
        need = nbytes + nbytes // ranks
        if free is not None and need > free:
            raise ConfigError(
                f"{name}: a message of {nbytes / 2**30:.1f} GiB needs {need / 2**30:.1f} GiB a "
                f"rank, and {device} has {free / 2**30:.1f} GiB free for each",
                hint="time a smaller --size",
            )


def job_collective_sizes(job: Job) -> dict[str, int]:
    """The messages of the job's collectives, in bytes (nccl-tests' convention: the whole
    tensor): a layer's activations that tensor parallelism all-reduces, and one GPU's
    gradients that data parallelism reduces."""
    from primus.core.projection import project

    tokens = job.micro_batch * job.seq_len // job.cp
    sizes = {"tp_activations": tokens * job.model.hidden * job.activation_bytes}
    gradients = int(project(job).parameters_per_gpu * job.grad_bytes)
    return sizes | {"dp_gradients": gradients - gradients % 4}


def bus_factor(op: str, ranks: int) -> float:
    """nccl-tests' bus-bandwidth factor: all-reduce 2(n-1)/n, the others (n-1)/n."""
    return (2 if op == "all_reduce" else 1) * (ranks - 1) / ranks


def bus_gbs(op: str, nbytes: int, ms: float, ranks: int) -> float:
    """nccl-tests' bus bandwidth (GB/s) of `op` on `nbytes` (the whole tensor) in `ms`."""
    return nbytes / (ms / 1e3) * bus_factor(op, ranks) / 1e9


def time_collective(
    torch: Any, cuda: bool, op: str, nbytes: int, repeats: int, warmup: int, group: Any = None
) -> float:
    """The median milliseconds of collective `op` on `nbytes` (the whole tensor) over every
    rank of `group` (default: the default process group)."""
    dist = torch.distributed
    ranks = dist.get_world_size(group)
    full = torch.ones(nbytes // 4, dtype=torch.float32, device="cuda" if cuda else "cpu")
    part = full[: full.numel() // ranks].clone()
    whole = full[: part.numel() * ranks]
    calls = {
        "all_reduce": partial(dist.all_reduce, full, group=group),
        "all_gather": partial(dist.all_gather_into_tensor, whole, part, group=group),
        "reduce_scatter": partial(dist.reduce_scatter_tensor, part, whole, group=group),
    }
    return statistics.median(timed(torch, cuda, calls[op], repeats, warmup))


@contextmanager
def process_group() -> Iterator[tuple[Any, bool, DistEnv]]:
    """This process in the default process group, NCCL on its GPU or gloo on the CPU, from
    torchrun's environment (a lone process's without it): torch, whether on a GPU, the env.
    Destroyed on exit."""
    import torch
    import torch.distributed as dist

    env = get_torchrun_env()
    env.export()
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(env.local_rank)
    dist.init_process_group("nccl" if cuda else "gloo")
    try:
        yield torch, cuda, env
    finally:
        dist.destroy_process_group()


def run_collectives(
    sizes: dict[str, int], repeats: int, warmup: int
) -> tuple[str, int, list[dict[str, Any]]] | None:
    """In each rank (torchrun's environment): every collective at every size; on rank 0 the
    device, the number of ranks and a row each (time, algorithm and bus bandwidth); None on
    the others."""
    with process_group() as (torch, cuda, env):
        free = free_bytes(torch, cuda)  # the host's memory is shared by the node's ranks
        if free is not None and not cuda:
            free //= env.local_world_size
        if free is not None:  # the least any rank has: every rank refuses, or none
            least = torch.tensor([free], dtype=torch.int64, device="cuda" if cuda else "cpu")
            torch.distributed.all_reduce(least, torch.distributed.ReduceOp.MIN)
            free = int(least.item())
        check_messages_fit(sizes, env.world_size, "cuda" if cuda else "cpu", free)
        rows = []
        for name, nbytes in sizes.items():
            for op in COLLECTIVES:
                ms = time_collective(torch, cuda, op, nbytes, repeats, warmup)
                algbw = nbytes / (ms / 1e3) / 1e9
                rows.append({"message": name, "op": op, "bytes": nbytes, "median_ms": ms,
                             "algbw_gbs": algbw, "busbw_gbs": algbw * bus_factor(op, env.world_size)})  # fmt: skip
        device = torch.cuda.get_device_name() if cuda else "cpu"
        return (device, env.world_size, rows) if env.rank == 0 else None


def render_collectives(device: str, ranks: int, rows: list[dict[str, Any]]) -> str:
    lines = [
        f"{ranks} ranks, device {device}",
        f"{'message':<16} {'op':<15} {'MiB':>9} {'median ms':>10} {'algbw GB/s':>11} "
        f"{'busbw GB/s':>11}",
    ]
    for r in rows:
        lines.append(
            f"{r['message']:<16} {r['op']:<15} {r['bytes'] / (1 << 20):>9.2f} "
            f"{r['median_ms']:>10.3f} {r['algbw_gbs']:>11.3f} {r['busbw_gbs']:>11.3f}"
        )
    return "\n".join(lines) + "\n"
