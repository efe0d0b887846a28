"""`primus preflight`'s checks, run in every rank of the job: the device and its health (ECC
errors, clocks: `gpu_health`), host memory and CPU, the workspace's free disk and write speed
(once a node), GEMM TFLOP/s, the all-reduce and all-gather bus bandwidth over all ranks, and
the all-reduce's within each node.
torch is imported only inside `run`.

Test hooks: PRIMUS_PREFLIGHT_SLOW_RANK=R makes rank R's GEMM ten times slower on purpose (it
sleeps nine times the matmul's time inside the timed region), PRIMUS_PREFLIGHT_SLOW_NODE=N
node N's all-reduce (its time counted ten times), so that a test sees an outlier caught, clear
of a loaded machine's noise.
"""

from __future__ import annotations

import os
import re
import socket
import time
from pathlib import Path
from typing import Any

from primus.core.diagnostics.benchmark import bus_gbs, process_group, time_collective, timed
from primus.core.diagnostics.gpu_health import gpu_health
from primus.core.diagnostics.host import GIB, host_info
from primus.core.errors import ConfigError
from primus.core.folders import unwritable

SLOW_RANK = "PRIMUS_PREFLIGHT_SLOW_RANK"
SLOW_NODE = "PRIMUS_PREFLIGHT_SLOW_NODE"
PROBE_BYTES = 64 << 20  # the disk write probe


def check_workspace(workspace: Path) -> Path:
    """`workspace` made (if missing) and resolved; a ConfigError if it cannot be written."""
    why = unwritable(workspace)
    if why is not None:
        raise ConfigError(f"workspace {workspace} cannot take files: {why}")
    return workspace.resolve()


def disk_write(workspace: Path, nbytes: int = PROBE_BYTES) -> dict[str, float]:
    """The workspace's free space (GiB) and write speed (MB/s): `nbytes` written, fsync'ed,
    timed, removed."""
    path = workspace / f".preflight-probe-{socket.gethostname()}-{os.getpid()}"
    block = os.urandom(1 << 20)
    try:
        start = time.perf_counter()
        with open(path, "wb") as out:
            for _ in range(nbytes // len(block)):
                out.write(block)
            out.flush()
            os.fsync(out.fileno())
        seconds = time.perf_counter() - start
    finally:
        path.unlink(missing_ok=True)
    free = os.statvfs(workspace)
    return {
        "disk_free_gib": round(free.f_bavail * free.f_frsize / GIB, 1),
        "disk_write_mbs": nbytes / seconds / 1e6,
    }


def _driver_version() -> str | None:
    """The GPU kernel driver's version (NVIDIA's or AMD's), None where neither says it."""
    for path in ("/proc/driver/nvidia/version", "/sys/module/amdgpu/version"):
        try:
            match = re.search(r"\d+\.\d+(\.\d+)*", Path(path).read_text())
        except OSError:
            continue
        if match:
            return match.group()
    return None


def _device_info(torch: Any, cuda: bool) -> dict[str, Any]:
    """This rank's GPU (model, memory, CUDA or HIP and driver version, GPUs on the node)."""
    if not cuda:
        return {"device": "cpu", "gpus": 0, "device_memory_gib": None}
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    runtime = f"cuda {torch.version.cuda}" if torch.version.cuda else f"hip {torch.version.hip}"
    return {
        "device": props.name,
        "gpus": torch.cuda.device_count(),
        "device_memory_gib": round(props.total_memory / GIB, 1),
        "runtime": runtime,
        "driver": _driver_version(),
    }


def _pci_bus(torch: Any) -> str:
    """The PCI address of this rank's GPU, as NVML names it (CUDA's indices may be remapped)."""
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return f"{props.pci_domain_id:08x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"


def _timed(torch: Any, cuda: bool, fn: Any, repeats: int) -> list[float]:
    """Seconds of each of `repeats` calls of `fn`, after one warm-up call (`benchmark.timed`)."""
    return [ms / 1e3 for ms in timed(torch, cuda, fn, repeats, warmup=1)]


def gemm_tflops(torch: Any, cuda: bool, slow: bool, repeats: int = 5) -> float:
    """TFLOP/s of an n x n matmul (bf16 8192 on a GPU, float32 512 on CPU), from the fastest
    repeat: a healthy device stalled once by the host is not an outlier, a slow one is slow
    every time."""
    n, dtype = (8192, torch.bfloat16) if cuda else (512, torch.float32)
    a = torch.randn(n, n, dtype=dtype, device="cuda" if cuda else "cpu")
    b = torch.randn_like(a)

    def matmul() -> None:
        began = time.perf_counter()
        torch.matmul(a, b)
        if cuda:
            torch.cuda.synchronize()
        if slow:  # the test hook
            time.sleep(9 * (time.perf_counter() - began))

    return 2 * n**3 / min(_timed(torch, cuda, matmul, repeats)) / 1e12


def collectives(torch: Any, cuda: bool, world_size: int, repeats: int = 5) -> dict[str, Any]:
    """All-reduce and all-gather bus bandwidth (GB/s, nccl-tests' convention and formulas,
    median time) over all ranks: 256 MiB on GPUs, 4 MiB on CPU. None for a single rank."""
    nbytes = (256 if cuda else 4) << 20
    figures: dict[str, Any] = {"bytes": nbytes}
    for op in ("all_reduce", "all_gather"):
        busbw = None
        if world_size > 1:
            ms = time_collective(torch, cuda, op, nbytes, repeats, warmup=1)
            busbw = bus_gbs(op, nbytes, ms, world_size)
        figures[f"{op}_busbw_gbs"] = busbw
    return figures


def node_bandwidth(torch: Any, cuda: bool, env: Any, slow: bool, repeats: int = 5) -> float | None:
    """The all-reduce bus bandwidth (GB/s) within this rank's node, every node at once, on its
    local rank 0; None elsewhere, and for a job of one node or one process a node. Nodes are
    torchrun's and Slurm's blocks of `local_world_size` consecutive ranks."""
    per_node = env.local_world_size
    nodes = env.world_size // per_node
    if nodes < 2 or per_node < 2:
        return None
    dist = torch.distributed
    groups = [dist.new_group(list(range(n * per_node, (n + 1) * per_node))) for n in range(nodes)]
    nbytes = (256 if cuda else 4) << 20
    began = time.perf_counter()
    ms = time_collective(torch, cuda, "all_reduce", nbytes, repeats, warmup=1,
                         group=groups[env.rank // per_node])  # fmt: skip
    if slow:  # the test hook: this node's links ten times slower
        ms += 9 * (time.perf_counter() - began) * 1e3 / (repeats + 1)
    return bus_gbs("all_reduce", nbytes, ms, per_node) if env.local_rank == 0 else None


def run(workspace: Path) -> tuple[list[dict[str, Any]], dict[str, Any]] | None:
    """Run the checks in this rank (torchrun's or Slurm's environment, else a lone process):
    on rank 0, every rank's figures (rank order) and the collectives; None on the others.
    On CPU the ranks time their GEMM one after another, as they share the cores."""
    with process_group() as (torch, cuda, env):
        dist = torch.distributed
        figures: dict[str, Any] = {"rank": env.rank, "local_rank": env.local_rank}
        figures |= host_info() | _device_info(torch, cuda)
        slow = os.environ.get(SLOW_RANK) == str(env.rank)
        for turn in range(1 if cuda else env.world_size):
            if cuda or turn == env.rank:
                figures["gemm_tflops"] = gemm_tflops(torch, cuda, slow)
            dist.barrier()
        figures |= gpu_health(_pci_bus(torch) if cuda else None, env.rank)  # clocks under load
        figures |= {"disk_free_gib": None, "disk_write_mbs": None}
        if env.local_rank == 0:  # the disk is the node's: measured once
            figures |= disk_write(workspace)
        dist.barrier()
        job = collectives(torch, cuda, env.world_size)
        slow_node = os.environ.get(SLOW_NODE) == str(env.rank // env.local_world_size)
        figures["node_busbw_gbs"] = node_bandwidth(torch, cuda, env, slow_node)
        everyone: list[Any] = [None] * env.world_size
        dist.all_gather_object(everyone, figures)
        return (everyone, job) if env.rank == 0 else None
