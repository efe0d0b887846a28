"""The blended sample order of core's BlendedSamples: the numpy block simulation against the
plain greedy loop it replaced (Megatron's build_blending_indices in Python), same arrays.

    cd tools/bench && uv run python bench_blend_order.py --sizes 1000000 10000000 --repeats 3

Both run in this process, one after the other, `repeats` times per size; the table gives the
medians of the wall and CPU seconds (CPU time is steadier on a shared machine) and the ratios.
Every run's arrays are compared with the loop's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
from common import environment

from primus.core.data.blend import _blending_order
from primus.testing.blend_order import greedy_blend_order as loop_order


def timed(order: Any, weights: list[float], size: int) -> tuple[float, float, Any]:
    """Wall and CPU seconds of one call, and its arrays."""
    wall, cpu = time.perf_counter(), time.process_time()
    arrays = order(weights, size)
    return time.perf_counter() - wall, time.process_time() - cpu, arrays


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--weights", type=float, nargs="+", default=[0.5, 0.3, 0.2])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, help="write the JSON record here")
    args = parser.parse_args()
    raw = np.array(args.weights, dtype=np.float64)
    weights = (raw / np.sum(raw)).tolist()  # normalized as BlendedSamples normalizes them
    load = os.getloadavg()[0]
    rows: dict[int, dict[str, float]] = {}
    for size in args.sizes:
        runs: dict[str, list[tuple[float, float]]] = {"loop": [], "numpy": []}
        for _ in range(args.repeats):
            *loop, expected = timed(loop_order, weights, size)
            *fast, got = timed(_blending_order, weights, size)
            if not all(np.array_equal(a, b) for a, b in zip(got, expected, strict=True)):
                raise SystemExit(f"the arrays differ at {size} samples")
            runs["loop"].append((loop[0], loop[1]))
            runs["numpy"].append((fast[0], fast[1]))
        row = {
            f"{name}_{kind}": statistics.median(run[i] for run in runs[name])
            for name in runs
            for i, kind in enumerate(("s", "cpu_s"))
        }
        row["speedup"] = row["loop_s"] / row["numpy_s"]
        row["cpu_speedup"] = row["loop_cpu_s"] / row["numpy_cpu_s"]
        rows[size] = row
    print("| samples | loop s | numpy s | x | loop CPU s | numpy CPU s | x CPU |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for size, r in rows.items():
        print(
            f"| {size:,} | {r['loop_s']:.2f} | {r['numpy_s']:.3f} | {r['speedup']:.0f} | "
            f"{r['loop_cpu_s']:.2f} | {r['numpy_cpu_s']:.3f} | {r['cpu_speedup']:.0f} |"
        )
    if args.out:
        record = {
            **environment(("primus-core", "numpy"), device=f"CPU ({os.cpu_count()} cores)"),
            "weights": weights,
            "repeats": args.repeats,
            "load_average_1min_before_after": [load, os.getloadavg()[0]],
            "identical": True,
            "runs": {str(size): row for size, row in rows.items()},
        }
        args.out.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
