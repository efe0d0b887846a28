"""One Megatron experiment through `primus train`, several ways, in one run: step time,
throughput, peak memory and loss curve of each variant, against the first.

    python tools/bench/bench_megatron_variants.py \
        --config configs/megatron/llama3.2_1B-pretrain.yaml --iters 30 --warmup 10 \
        --variant turbo turbo.enable=true \
        --variant graphs turbo.enable=true cuda_graph_impl=full_iteration \
        --out variants.json

`--variant NAME OVERRIDE...` may repeat; `--nproc N` runs every variant on N GPUs. Variants run
alternating, `--rounds` times each; time and throughput are Megatron's own log line (median
after `--warmup` iterations), the peak memory Megatron's "max allocated", the reserved peak
(the allocator's cache and CUDA graphs' pools too) and the losses the run's metrics.jsonl. A variant that fails is reported and the others still run (compared with the
first that ran). Prints a Markdown table and writes the raw numbers as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from bench_megatron import parse_log
from common import COLUMNS, device_label, environment, medians, print_table, resolved_params, run


def step_lines(workspace: Path, name: str) -> list[dict]:
    metrics = next(workspace.rglob(f"{name}/metrics.jsonl"))
    return list(map(json.loads, metrics.read_text().splitlines()))


def losses(workspace: Path, name: str) -> dict[int, float]:
    return {m["step"]: m["loss"] for m in step_lines(workspace, name)}


def reserved_gib(workspace: Path, name: str) -> float | None:
    """The most the allocator held from the device (Primus's step metrics), or None."""
    reserved = [m["reserved_memory_gib"] for m in step_lines(workspace, name)]
    return max(reserved) if None not in reserved else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--variant", nargs="+", action="append", required=True,
                        metavar=("NAME", "OVERRIDE"))  # fmt: skip
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--nproc", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("megatron-variants.json"))
    opts = parser.parse_args()
    common = [f"train_iters={opts.iters}", "log_interval=1", "log_throughput=true"]
    launch = ["--nproc-per-node", str(opts.nproc)] if opts.nproc > 1 else []
    variants = {name: overrides for name, *overrides in opts.variant}
    workspace = Path(tempfile.mkdtemp(prefix="variants-"))
    runs: dict[str, list[dict]] = {name: [] for name in variants}
    curves: dict[str, dict[int, float]] = {}
    failed: dict[str, str] = {}
    for i in range(opts.rounds):
        for name, overrides in variants.items():
            exp = f"{name}-{i}"
            command = [sys.executable, "-m", "primus.cli", "train", "pretrain", "--config",
                       str(opts.config), *launch, *common, *overrides, f"exp_name={exp}"]  # fmt: skip
            env = {"PRIMUS_WORKSPACE": str(workspace)}
            try:
                measured = parse_log(run(command, opts.out.parent / f"{exp}.log", env), opts.warmup)
                runs[name].append(measured | {"reserved_memory_gib": reserved_gib(workspace, exp)})
            except SystemExit as failure:  # the other variants still run
                print(f"{name} failed: {failure}", flush=True)
                failed[name] = str(failure)[-2000:]
                continue
            curves.setdefault(name, losses(workspace, exp))
    summary = {}
    for name, measured in runs.items():
        if not measured:
            continue
        params = resolved_params(opts.config, variants[name])
        tokens = params["global_batch_size"] * params["seq_length"]
        summary[name] = medians(measured, ("ms_per_iter", "tflops_per_gpu"))
        summary[name]["tokens_per_s_per_gpu"] = (
            tokens / opts.nproc / (summary[name]["ms_per_iter"] / 1000)
        )
        summary[name]["mfu"] = summary[name]["tflops_per_gpu"] / 989.0  # H100/H200 dense bf16
        summary[name]["peak_memory_gib"] = max(r["peak_memory_gib"] for r in measured)
        reserved = [r["reserved_memory_gib"] for r in measured]
        summary[name]["reserved_memory_gib"] = max(reserved) if None not in reserved else None
        summary[name]["runs"] = measured
    if not summary:
        raise SystemExit(f"every variant failed: {', '.join(failed)}")
    first = next(iter(summary))
    reference = curves[first]
    for name, curve in curves.items():
        summary[name]["speed_over_" + first] = (
            summary[first]["ms_per_iter"] / summary[name]["ms_per_iter"]
        )
        summary[name]["max_loss_rel_diff"] = max(
            abs(curve[s] - reference[s]) / abs(reference[s]) for s in reference if s in curve
        )
        summary[name]["losses"] = curve
    report = {
        **environment(
            ("torch", "triton", "megatron-core", "primus-megatron", "primus-turbo-kernels"),
            device_label(),
        ),
        "config": str(opts.config),
        "nproc": opts.nproc,
        "variants": variants,
        "failed": failed,
        **summary,
    }
    opts.out.write_text(json.dumps(report, indent=2))
    columns = (
        ("ms/iter", "ms_per_iter", ".1f"), *COLUMNS, ("reserved GiB", "reserved_memory_gib", ".1f"),
        (f"speed vs {first}", f"speed_over_{first}", ".3f"),
        (f"max loss diff vs {first}", "max_loss_rel_diff", ".2e"),
    )  # fmt: skip
    print_table(summary, columns, f"variants: {json.dumps(variants)}; failed: {list(failed)}")


if __name__ == "__main__":
    main()
