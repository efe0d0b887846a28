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

This file is the command line; the cases are in kernel_cases.py, the measuring in
kernel_harness.py, the targets, tables and JSON in kernel_report.py.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from pathlib import Path
from types import ModuleType

import torch
from kernel_cases import KERNELS
from kernel_harness import Row, copy_bandwidth, make_timer, run_case
from kernel_report import json_report, print_report, targets


def load_liger() -> ModuleType | str:
    """liger_kernel.ops, or why it is not there."""
    try:
        return importlib.import_module("liger_kernel.ops")
    except ImportError as error:
        return f"liger-kernel not importable ({error})"


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

    if opts.out:
        report = json_report(
            rows,
            checks,
            device,
            timing=timing,
            quick=opts.quick,
            liger=liger if isinstance(liger, str) else "liger_kernel.ops",
            copy={"bytes": copy_bytes, "gbps": copy_gbps},
        )
        opts.out.parent.mkdir(parents=True, exist_ok=True)
        opts.out.write_text(json.dumps(report, indent=2) + "\n")
        print(f"\nwrote {opts.out}")
    failed = [row for row in rows if row.note and row.note.startswith("error")]
    if failed:
        print(f"{len(failed)} provider runs failed (see the notes)", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
