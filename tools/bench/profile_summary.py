"""Where a training step's GPU time goes, from a torch.profiler Chrome trace.

    python tools/bench/profile_summary.py RUN_DIR/torch_profile/rank-0.json.gz

Megatron writes that trace with `profile: true`, `use_pytorch_profiler: true`,
`profile_step_start: N`, `profile_step_end: N+1` (one step). Prints the profiled window, the
time the GPU was busy (the union of kernel intervals) and idle, the kernel time per kind, and
the communication kernels' time and the part of it no other kernel overlaps (exposed), and
the top kernels by total time, as Markdown. `--gaps N`: the N longest stretches with no kernel
running, each with the host-side events (Python functions with
`pytorch_profiler_collect_callstack: true`, ATen ops, CUDA runtime calls) that overlap it most:
what the CPU was doing while the GPU waited. TorchTitan writes it with
`profiler.enable_profiling=true profiler.profile_freq=N` (RUN_DIR/profiling/traces/iteration_N/
rank0_trace.json.gz).
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
from collections import defaultdict
from pathlib import Path

# First match wins: (kind, pattern on the kernel name).
KINDS = (
    ("attention (SDPA flash/efficient)", r"flash|fmha|attention|sdpa"),
    ("GEMM", r"gemm|cutlass|xmma|nvjet|cublas|matmul|sm\d+_"),
    ("communication", r"nccl"),
    ("optimizer", r"adam|multi_tensor|foreach"),
    ("Triton", r"^_|triton"),
    ("memory copy/set", r"memcpy|memset|copy|fill"),
)


HOST = ("python_function", "cpu_op", "cuda_runtime", "user_annotation")  # host-side event kinds


def kind(name: str) -> str:
    return next((k for k, pattern in KINDS if re.search(pattern, name, re.I)), "other elementwise")


def busy_time(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def idle_gaps(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The stretches between the union of the [start, end) intervals, longest first."""
    gaps, reach = [], None
    for start, end in sorted(spans):
        if reach is not None and start > reach:
            gaps.append((reach, start))
        reach = end if reach is None else max(reach, end)
    return sorted(gaps, key=lambda gap: gap[0] - gap[1])


def print_gaps(events: list[dict], spans: list[tuple[float, float]], count: int) -> None:
    """The `count` longest idle stretches and the host events overlapping each most."""
    window = max(end for _, end in spans) - min(start for start, _ in spans)
    host = [e for e in events if e.get("cat") in HOST and e.get("dur", 0) < window / 2]
    print("\n| idle gap | ms | host events overlapping it (ms) |\n|---|---|---|")
    first = min(start for start, _ in spans)
    for start, end in idle_gaps(spans)[:count]:
        overlaps = [
            (min(end, e["ts"] + e["dur"]) - max(start, e["ts"]), e["dur"], e["name"])
            for e in host
            if e["ts"] < end and e["ts"] + e["dur"] > start
        ]
        top = sorted(overlaps, key=lambda o: (-o[0], o[1]))[:6]
        said = "; ".join(f"`{name[:60]}` {o / 1e3:.1f}" for o, _, name in top)
        print(f"| at {(start - first) / 1e3:.1f} | {(end - start) / 1e3:.1f} | {said} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", type=Path)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--gaps", type=int, default=0, help="list the N longest idle stretches")
    opts = parser.parse_args()
    opener = gzip.open if opts.trace.suffix == ".gz" else open
    with opener(opts.trace, "rt") as f:
        events = json.load(f)["traceEvents"]
    kernels = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    spans = [(e["ts"], e["ts"] + e["dur"]) for e in kernels]
    window = max(end for _, end in spans) - min(start for start, _ in spans)
    busy = busy_time(spans)
    by_kind: dict[str, float] = defaultdict(float)
    by_name: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for e in kernels:
        by_kind[kind(e["name"])] += e["dur"]
        by_name[e["name"]][0] += e["dur"]
        by_name[e["name"]][1] += 1
    print(f"window {window / 1e3:.1f} ms, GPU busy {busy / 1e3:.1f} ms ({busy / window:.1%}), "
          f"idle {(window - busy) / 1e3:.1f} ms")  # fmt: skip
    talking = [kind(e["name"]) == "communication" for e in kernels]
    comm = [span for span, c in zip(spans, talking, strict=True) if c]
    exposed = busy - busy_time([span for span, c in zip(spans, talking, strict=True) if not c])
    print(f"communication {busy_time(comm) / 1e3:.1f} ms, exposed {exposed / 1e3:.1f} ms "
          "(no other kernel running)\n")  # fmt: skip
    print("| kind | ms | of kernel time |\n|---|---|---|")
    kernel_total = sum(by_kind.values())
    for name, us in sorted(by_kind.items(), key=lambda kv: -kv[1]):
        print(f"| {name} | {us / 1e3:.1f} | {us / kernel_total:.1%} |")
    print("\n| kernel | calls | ms |\n|---|---|---|")
    for name, (us, calls) in sorted(by_name.items(), key=lambda kv: -kv[1][0])[: opts.top]:
        print(f"| `{name[:90]}` | {calls} | {us / 1e3:.1f} |")
    if opts.gaps:
        print_gaps(events, spans, opts.gaps)


if __name__ == "__main__":
    main()
