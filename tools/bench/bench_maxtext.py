"""Primus vs MaxText run directly, same GPU, same model, same settings, in one run.

    python tools/bench/bench_maxtext.py --config configs/maxtext/llama3.2_1B-pretrain.yaml \
        --steps 30 --warmup 5 --rounds 1 --out bench.json

Runs `primus train pretrain --config ...` and MaxText's own entry point (`python -m
maxtext.trainers.pre_train.train <base.yml> key=value ...`, no Primus) with the command line
Primus builds from the resolved experiment (the same `maxtext_argv`), alternating, `--rounds`
times each. Both are measured by MaxText's own step line (seconds, TFLOP/s/device,
Tokens/s/device), which Primus keeps in its log: one clock, one formula. MFU is TFLOP/s/device
over the GPU's dense bf16 peak (MaxText's FLOP count halves causal attention). Memory is XLA's
compiled estimate, which both print, and for Primus also the peak it measured. Steps before
`--warmup` (MaxText counts from 0) are dropped and the median is taken. `--gpus N` runs both
on the host's first N GPUs (one process drives them), `--runs` picks either, and trailing
`key=value` overrides go to both (MaxText's names).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

from common import (
    COLUMNS,
    MFU_COLUMNS,
    environment,
    gpu_name,
    medians,
    mfu_both_ways,
    module_params,
    print_table,
    resolved,
    run,
)

STEP = re.compile(
    r"completed step: (\d+), seconds: ([\d.]+), TFLOP/s/device: ([\d.]+), Tokens/s/device: ([\d.]+)"
)
ESTIMATE = re.compile(r"\[train\] Total estimated memory size: ([\d.]+) GB")
PEAK = re.compile(r"\| peak mem ([\d.]+) GiB")


def maxtext_command(params: dict, out: Path, run_name: str) -> list[str]:
    """MaxText's own command line for the experiment, through the function Primus uses."""
    from primus.backends.maxtext.config.bridge import maxtext_argv
    from primus.backends.maxtext.devices.cudnn_attention import autoselected_on_nvidia
    from primus.core.config.schema import registered_params
    from primus.core.patches import PatchContext
    from primus.core.patches.registry import load_patch_modules

    load_patch_modules()  # the keys Primus's patches own are not MaxText's
    if autoselected_on_nvidia(PatchContext("maxtext", "setup", None, "0", params)):
        params = {**params, "attention": "cudnn_flash_jax"}  # the kernel Primus's run gets
    argv = maxtext_argv(params, registered_params("maxtext"))
    # what Primus's run_dir and jax_distributed patches add in a run
    outputs = [
        f"base_output_directory={out}",
        f"run_name={run_name}",
        "skip_jax_distributed_system=true",
    ]
    return [sys.executable, "-m", "maxtext.trainers.pre_train.train", *argv[1:], *outputs]


def parse_log(text: str, warmup: int, peak: float | None) -> dict[str, float | None]:
    rows = [m.groups() for m in STEP.finditer(text) if int(m.group(1)) >= warmup]
    if not rows:
        raise SystemExit("no step lines after warm-up in:\n" + text[-3000:])
    column = lambda i: [float(r[i]) for r in rows]  # noqa: E731
    tflops = statistics.median(column(2))
    return {
        "tokens_per_s_per_gpu": statistics.median(column(3)),
        "tflops_per_gpu": tflops,
        "mfu": tflops / peak if peak else None,
        "estimated_memory_gb": max(map(float, ESTIMATE.findall(text)), default=None),
        "peak_memory_gib": max(map(float, PEAK.findall(text)), default=None),
        "steps_measured": len(rows),
    }


def model_shape(params: dict) -> dict[str, int]:
    """The dense decoder's shape, for flops_per_token, from MaxText's resolved keys."""
    return {
        "layers": params["base_num_decoder_layers"],
        "hidden": params["base_emb_dim"],
        "ffn": params["base_mlp_dim"],
        "heads": params["base_num_query_heads"],
        "kv_heads": params["base_num_kv_heads"],
        "vocab": params["vocab_size"],
        "seq": params["max_target_length"],
    }


def main() -> None:
    from primus.core.metrics import peak_tflops

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument(
        "--gpus", type=int, help="the host's first N GPUs (default: all), one process"
    )
    parser.add_argument(
        "--runs", nargs="+", choices=("primus", "maxtext"), default=["primus", "maxtext"]
    )
    parser.add_argument("--out", type=Path, default=Path("maxtext-bench.json"))
    parser.add_argument("overrides", nargs="*", help="key=value for both runs (MaxText's names)")
    opts = parser.parse_args()
    device = gpu_name()
    peak = peak_tflops(device)
    experiment = resolved(opts.config, opts.overrides)
    params = module_params(experiment) | {"steps": opts.steps}
    logs = opts.out.parent.resolve()
    logs.mkdir(parents=True, exist_ok=True)
    gpus = {"CUDA_VISIBLE_DEVICES": ",".join(map(str, range(opts.gpus)))} if opts.gpus else {}
    # the experiment's `env:` (Primus sets it before JAX starts), for MaxText's own run too
    env = {key: str(value) for key, value in (experiment.get("env") or {}).items()} | gpus
    results: dict[str, list[dict]] = {name: [] for name in opts.runs}
    plain = []
    for i in range(opts.rounds):
        primus = [sys.executable, "-m", "primus.cli", "train", "pretrain", "--config",
                  str(opts.config), *opts.overrides, f"steps={opts.steps}", f"exp_name=bench-{i}"]  # fmt: skip
        plain = maxtext_command(params, logs / "maxtext-outputs", f"plain-{i}")
        for name in opts.runs:
            text = run(primus if name == "primus" else plain, logs / f"{name}-{i}.log", env)
            results[name].append(parse_log(text, opts.warmup, peak))
    summary = {}
    for name, runs in results.items():
        summary[name] = medians(runs, ("tokens_per_s_per_gpu", "tflops_per_gpu"))
        summary[name]["mfu"] = summary[name]["tflops_per_gpu"] / peak if peak else None
        summary[name] |= mfu_both_ways(
            summary[name]["tokens_per_s_per_gpu"], model_shape(params), peak
        )
        for key in ("estimated_memory_gb", "peak_memory_gib"):
            summary[name][key] = max((r[key] for r in runs if r[key] is not None), default=None)
        summary[name]["runs"] = runs
    both = {"primus", "maxtext"} <= summary.keys()
    ratio = (
        summary["primus"]["tokens_per_s_per_gpu"] / summary["maxtext"]["tokens_per_s_per_gpu"]
        if both
        else None
    )
    report = {
        **environment(("jax", "jaxlib", "maxtext", "primus-maxtext"), device),
        "config": str(opts.config),
        "gpus": opts.gpus,
        "overrides": opts.overrides,
        "maxtext_command": plain,
        "primus_over_maxtext": ratio,
        **summary,
    }
    opts.out.write_text(json.dumps(report, indent=2))
    columns = (
        *COLUMNS[:3],
        *MFU_COLUMNS,
        ("XLA memory estimate GB", "estimated_memory_gb", ".1f"),
        COLUMNS[3],
    )
    print_table(summary, columns, f"primus / maxtext (tokens/s): {ratio:.4f}" if both else "")


if __name__ == "__main__":
    main()
