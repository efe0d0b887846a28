"""`primus preflight --node-smoke`: this node alone, with no rendezvous, so that one bad node
cannot hang the check of the others.

Each GPU is checked in a process of its own, under a time limit (a hung GPU fails, the check
goes on): allocate a buffer, time device-memory copies, and run the same GEMM twice, whose
results must be finite and equal. Then the host: shared memory and the locked-memory limit
(NCCL and RDMA need them on GPU nodes), and processes left running on the GPUs. The node's
name is appended to a passing or a failing list that a scheduler can use (Slurm's
`--nodelist` / `--exclude`). On a node without GPUs the CPU is checked the same way.

Test hooks: PRIMUS_PREFLIGHT_BAD_DEVICE=I (a GPU index, or `cpu`) puts a NaN in that device's
GEMM result; PRIMUS_PREFLIGHT_HANG_DEVICE=I makes its check hang.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from primus.core.diagnostics.host import GIB, host_info
from primus.core.reliability.atomic import append_line

BAD_DEVICE = "PRIMUS_PREFLIGHT_BAD_DEVICE"
HANG_DEVICE = "PRIMUS_PREFLIGHT_HANG_DEVICE"
SHM_MIN_GIB = 1.0  # what NCCL's shared-memory transport and data-loader workers need at least
BUFFER_BYTES = {"cuda": 1 << 30, "cpu": 128 << 20}  # allocated and copied
GEMM_SIZE = {"cuda": 4096, "cpu": 256}


def device_check(name: str) -> dict[str, Any]:
    """Check one device in this process: `name` is a GPU index (the only visible GPU is then
    cuda:0, as CUDA_VISIBLE_DEVICES leaves it) or `cpu`."""
    import torch

    kind = "cpu" if name == "cpu" else "cuda"
    if os.environ.get(HANG_DEVICE) == name:
        time.sleep(1e9)
    found: dict[str, Any] = {"device": name, "problems": []}
    if kind == "cuda":
        props = torch.cuda.get_device_properties(0)
        found |= {"model": props.name, "memory_gib": round(props.total_memory / GIB, 1)}
    buffer = torch.ones(BUFFER_BYTES[kind], dtype=torch.uint8, device=kind)
    copy = torch.empty_like(buffer)
    times = []
    for _ in range(5):
        began = time.perf_counter()
        copy.copy_(buffer)
        if kind == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - began)
    found["copy_gbs"] = 2 * buffer.numel() / statistics.median(times) / 1e9  # read + write
    n = GEMM_SIZE[kind]
    generator = torch.Generator(device=kind).manual_seed(0)
    dtype = torch.bfloat16 if kind == "cuda" else torch.float32
    a, b = (torch.randn(n, n, generator=generator, device=kind, dtype=dtype) for _ in "ab")
    first, second = a @ b, a @ b
    if os.environ.get(BAD_DEVICE) == name:
        first[0, 0] = float("nan")
    if not bool(torch.isfinite(first).all()):
        found["problems"].append("GEMM result is not finite")
    elif not torch.equal(first, second):
        found["problems"].append("the same GEMM gave two different results")
    return found


def host_limits(gpus: int) -> tuple[dict[str, Any], list[str]]:
    """/dev/shm's size and the locked-memory limit; problems only on a GPU node."""
    shm = os.statvfs("/dev/shm") if os.path.isdir("/dev/shm") else None
    shm_gib = round(shm.f_blocks * shm.f_frsize / GIB, 1) if shm else 0.0
    soft = resource.getrlimit(resource.RLIMIT_MEMLOCK)[0]
    memlock = "unlimited" if soft == resource.RLIM_INFINITY else f"{soft >> 10} KiB"
    problems = []
    if gpus and shm_gib < SHM_MIN_GIB:
        problems.append(
            f"/dev/shm is {shm_gib} GiB (NCCL and data loaders need >= {SHM_MIN_GIB} GiB; "
            "in a container: --shm-size or --ipc=host)"
        )
    if gpus and memlock != "unlimited":
        problems.append(f"locked memory is limited to {memlock} (RDMA wants ulimit -l unlimited)")
    return {"shm_gib": shm_gib, "memlock": memlock}, problems


def gpu_processes() -> list[str]:
    """Compute processes on this node's NVIDIA GPUs (pid, name, memory), from nvidia-smi."""
    if shutil.which("nvidia-smi") is None:
        return []
    query = [
        "nvidia-smi",
        "--query-compute-apps=pid,process_name,used_memory",
        "--format=csv,noheader",
    ]
    listed = subprocess.run(query, capture_output=True, text=True, timeout=60)
    return [line.strip() for line in listed.stdout.splitlines() if line.strip()]


def _gpu_count() -> int:
    import torch

    return torch.cuda.device_count()  # NVML: no CUDA context in this process


def check_node(timeout_s: float) -> dict[str, Any]:
    """Every device of this node in a process of its own, side by side, then the host."""
    gpus = _gpu_count()
    leftovers = gpu_processes()  # before our own processes start
    names = [str(i) for i in range(gpus)] or ["cpu"]
    children = {}
    for name in names:
        env = os.environ | ({} if name == "cpu" else {"CUDA_VISIBLE_DEVICES": name})
        children[name] = subprocess.Popen(
            [sys.executable, "-m", "primus.core.diagnostics.node_smoke", name],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
    deadline = time.monotonic() + timeout_s
    devices = []
    for name, child in children.items():
        try:
            out, err = child.communicate(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.kill()
            child.communicate()
            problem = f"did not finish in {timeout_s:g} s (a hung device?)"
            devices.append({"device": name, "problems": [problem]})
            continue
        if child.returncode != 0:
            tail = err.strip().splitlines()[-1:] or [f"exit code {child.returncode}"]
            devices.append({"device": name, "problems": [f"the check failed: {tail[0]}"]})
        else:
            devices.append(json.loads(out))
    limits, problems = host_limits(gpus)
    problems += [f"a process is running on the GPUs: {line}" for line in leftovers]
    passed = not problems and not any(d["problems"] for d in devices)
    return {"host": host_info(), "devices": devices, "limits": limits, "problems": problems,
            "passed": passed}  # fmt: skip


def render(report: dict[str, Any]) -> str:
    """The node's report as printed: a line a device, the host's limits and problems."""
    lines = [f"{'device':<8} {'model':<28} {'GiB':>6} {'copy GB/s':>10}  status"]
    for d in report["devices"]:
        copy = f"{d['copy_gbs']:.1f}" if "copy_gbs" in d else "-"
        status = "; ".join(d["problems"]) or "ok"
        model, gib = d.get("model", "-" if d["device"] != "cpu" else "cpu"), d.get("memory_gib")
        lines.append(f"{d['device']:<8} {model:<28} {gib or '-':>6} {copy:>10}  {status}")
    limits = report["limits"]
    lines.append(f"host {report['host']['host']}: /dev/shm {limits['shm_gib']} GiB, "
                 f"locked memory {limits['memlock']}")  # fmt: skip
    lines += [f"problem: {p}" for p in report["problems"]]
    lines.append(f"node-smoke: {'PASS' if report['passed'] else 'FAIL'} ({report['host']['host']})")
    return "\n".join(lines) + "\n"


def record(report: dict[str, Any], passing: Path | None, failing: Path | None) -> None:
    """Append this node's name to the passing or the failing list (one line each)."""
    target = passing if report["passed"] else failing
    if target is not None:  # one write: nodes sharing the list never tear each other's lines
        append_line(target, socket.gethostname())


if __name__ == "__main__":  # one device's check, in a process of its own
    print(json.dumps(device_check(sys.argv[1])))
