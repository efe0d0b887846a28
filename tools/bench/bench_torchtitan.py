"""Primus vs TorchTitan run directly, same GPUs, same model, same settings, in one run.

    python tools/bench/bench_torchtitan.py --config configs/torchtitan/llama3.2_1B-pretrain.yaml \
        --steps 30 --warmup 5 --rounds 1 [--compile] [--gpus N] --out bench.json [key=value ...]

Runs `primus train pretrain --config ...` and TorchTitan's own entry point (`python -m
torchtitan.train`, tools/bench/torchtitan_plain.py for the model and synthetic data, no Primus)
with the flags the resolved experiment stands for, alternating, `--rounds` times each (`--turbo`
adds Primus with `turbo.enable=true`, primus-turbo-kernels installed; `--runs` picks any of the
three). `--gpus N` runs each on N GPUs of the host; trailing `key=value` overrides go to every
run (Primus's names; the peer gets them as TorchTitan flags, except the model's dimensions,
which its CLI cannot set: those runs are Primus's alone; `model.attn_backend=varlen` picks the
peer's varlen config; the peer cannot run the 1B recipe's `sdpa`, so a run with it needs
`model.attn_backend=flex`). All are
measured by TorchTitan's own step line (tps, TFLOP/s, MFU, memory), which Primus keeps in its log:
one clock, one formula. The first `--warmup` steps are dropped and the median is taken.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
from pathlib import Path

from common import (
    COLUMNS,
    environment,
    installed,
    medians,
    module_params,
    print_table,
    resolved,
    run,
)

HERE = Path(__file__).resolve().parent
STEP = re.compile(
    r"step:\s*(\d+)\s+loss:.*?memory:\s*([\d.]+)GiB.*?tps:\s*([\d,]+)\s+tflops:\s*([\d,.]+)\s+mfu:\s*([\d.]+)%"
)


def torchtitan_flags(params: dict) -> list[str]:
    """TorchTitan's CLI flags for the experiment, through the same function Primus uses."""
    from primus.backends.torchtitan.config.bridge import cli_args
    from primus.backends.torchtitan.torchtitan_adapter import owned_keys

    optimizer = params.get("optimizer", {})
    lr = optimizer.get("lr")  # a Primus shorthand: TorchTitan spells it per param group
    lr_flag = ["--optimizer.param-groups.0.optimizer-kwargs.lr", str(lr)] if lr else []
    return lr_flag + cli_args(params, owned_keys())  # before any subcommand and its flags


def parse_log(text: str, warmup: int) -> dict[str, float]:
    rows = [m.groups() for m in STEP.finditer(text) if int(m.group(1)) > warmup]
    if not rows:
        raise SystemExit("no step lines after warm-up in:\n" + text[-3000:])
    column = lambda i: [float(r[i].replace(",", "")) for r in rows]  # noqa: E731
    return {
        "tokens_per_s_per_gpu": statistics.median(column(2)),
        "tflops_per_gpu": statistics.median(column(3)),
        "mfu": statistics.median(column(4)) / 100,
        "peak_memory_gib": max(column(1)),
        "steps_measured": len(rows),
    }


# The peer's config (a function of torchtitan_plain.py) for each model preset of the recipes.
PEER_CONFIGS = {"llama3.2_1B": "llama3_1b_synthetic", "llama3.1_8B": "llama3_8b_synthetic"}
PEER_ATTENTION = {"flex": "", "varlen": "_varlen"}  # model.attn_backend -> the config's suffix
RUNS = ("primus", "torchtitan", "primus-turbo")


def peer_command(experiment: dict, opts: argparse.Namespace, flags: list[str], i: int) -> list[str]:
    """TorchTitan run directly on the experiment's model, with its flags."""
    params = module_params(experiment)
    preset = params.get("model_name")
    attention = params.get("model", {}).get("attn_backend", "flex")
    unsettable = [o for o in opts.overrides
                  if o.startswith("model.") and not o.startswith("model.attn_backend=")]  # fmt: skip
    if preset not in PEER_CONFIGS or attention not in PEER_ATTENTION or unsettable:
        raise SystemExit(f"no peer for model {preset} with {opts.overrides}, attention "
                         f"{attention}: pass --runs without torchtitan (the peer has "
                         f"{', '.join(PEER_CONFIGS)}, attention {' or '.join(PEER_ATTENTION)}: "
                         "TorchTitan refuses sdpa for language models)")  # fmt: skip
    config = PEER_CONFIGS[preset] + PEER_ATTENTION[attention]
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(opts.gpus),
            "-m", "torchtitan.train", "--module", "torchtitan_plain", "--config",
            config, "--dump-folder", str(opts.out.parent / f"plain-{i}"), *flags]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--gpus", type=int, default=1, help="processes (GPUs) of one host")
    parser.add_argument("--runs", nargs="+", choices=RUNS, default=["primus", "torchtitan"])
    parser.add_argument(
        "--compile", action="store_true", help="torch.compile the model (every run)"
    )
    parser.add_argument("--turbo", action="store_true", help="also run Primus with turbo on")
    parser.add_argument("--out", type=Path, default=Path("torchtitan-bench.json"))
    parser.add_argument("overrides", nargs="*", help="key=value for every run (Primus's names)")
    opts = parser.parse_args()
    if opts.turbo and "primus-turbo" not in opts.runs:
        opts.runs.append("primus-turbo")
    settings = {"training": {"steps": opts.steps}, "metrics": {"log_freq": 1}}
    if opts.compile:
        settings["compile"] = {"enable": True}
    overrides = [*opts.overrides] + [
        f"{s}.{k}={str(v).lower() if isinstance(v, bool) else v}"
        for s, values in settings.items() for k, v in values.items()
    ]  # fmt: skip
    experiment = resolved(opts.config, overrides)
    flags = torchtitan_flags(module_params(experiment))
    logs = opts.out.parent
    logs.mkdir(parents=True, exist_ok=True)
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))}
    plain = ["turbo.enable=false"] if installed("primus-turbo-kernels") else []  # auto: on
    variants = {"primus": [*overrides, *plain], "primus-turbo": [*overrides, "turbo.enable=true"]}
    results: dict[str, list[dict[str, float]]] = {name: [] for name in opts.runs}
    for i in range(opts.rounds):
        commands = {
            name: [sys.executable, "-m", "primus.cli", "train", "pretrain", "--config",
                   str(opts.config), "--nproc-per-node", str(opts.gpus), *variants[name],
                   f"exp_name=bench-{name}-{i}"]
            for name in opts.runs if name != "torchtitan"
        }  # fmt: skip
        if "torchtitan" in opts.runs:
            commands["torchtitan"] = peer_command(experiment, opts, flags, i)
        for name in opts.runs:
            text = run(commands[name], logs / f"{name}-{i}{'-compile' * opts.compile}.log", env)
            results[name].append(parse_log(text, opts.warmup))
    summary = {
        name: medians(runs, ("tokens_per_s_per_gpu", "tflops_per_gpu", "mfu"))
        | {"peak_memory_gib": max(r["peak_memory_gib"] for r in runs), "runs": runs}
        for name, runs in results.items()
    }
    ratios = {
        f"{n.replace('-', '_')}_over_torchtitan": summary[n]["tokens_per_s_per_gpu"]
        / summary["torchtitan"]["tokens_per_s_per_gpu"]
        for n in opts.runs
        if n != "torchtitan" and "torchtitan" in opts.runs
    }
    dists = ("torch", "torchtitan", "primus-torchtitan", "triton", "primus-turbo-kernels")
    report = {
        **environment((*dists, "torchao")),
        "config": str(opts.config),
        "gpus": opts.gpus,
        "overrides": opts.overrides,
        "compile": opts.compile,
        "torchtitan_flags": flags,
        **ratios,
        **summary,
    }
    opts.out.write_text(json.dumps(report, indent=2))
    mode = "compiled" if opts.compile else "eager"
    ratio_text = ", ".join(f"{k} (tokens/s): {v:.4f}" for k, v in ratios.items())
    print_table(summary, COLUMNS, f"{ratio_text} ({mode})")


if __name__ == "__main__":
    main()
