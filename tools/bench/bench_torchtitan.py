"""Primus vs TorchTitan run directly, same GPU, same model, same settings, in one run.

    python tools/bench/bench_torchtitan.py --config configs/torchtitan/llama3.2_1B-pretrain.yaml \
        --steps 30 --warmup 5 --rounds 1 [--compile] --out bench.json

Runs `primus train pretrain --config ...` and TorchTitan's own entry point (`python -m
torchtitan.train`, tools/bench/torchtitan_plain.py for the model and synthetic data, no Primus)
with the flags the resolved experiment stands for, alternating, `--rounds` times each (`--turbo`
adds Primus with `turbo.enable=true`, primus-turbo-kernels installed). All are
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

from common import COLUMNS, environment, medians, print_table, resolved_params, run

HERE = Path(__file__).resolve().parent
STEP = re.compile(
    r"step:\s*(\d+)\s+loss:.*?memory:\s*([\d.]+)GiB.*?tps:\s*([\d,]+)\s+tflops:\s*([\d,.]+)\s+mfu:\s*([\d.]+)%"
)


def torchtitan_flags(params: dict) -> list[str]:
    """TorchTitan's CLI flags for the experiment, through the same function Primus uses."""
    from primus.backends.torchtitan.config_bridge import cli_args
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument(
        "--compile", action="store_true", help="torch.compile the model (both runs)"
    )
    parser.add_argument("--turbo", action="store_true", help="also run Primus with turbo on")
    parser.add_argument("--out", type=Path, default=Path("torchtitan-bench.json"))
    opts = parser.parse_args()
    settings = {"training": {"steps": opts.steps}, "metrics": {"log_freq": 1}}
    if opts.compile:
        settings["compile"] = {"enable": True}
    params = resolved_params(opts.config)
    for section, values in settings.items():
        params.setdefault(section, {}).update(values)
    flags = torchtitan_flags(params)
    overrides = [f"{s}.{k}={str(v).lower() if isinstance(v, bool) else v}"
                 for s, values in settings.items() for k, v in values.items()]  # fmt: skip
    logs = opts.out.parent
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))}
    variants = {"primus": overrides, "primus-turbo": [*overrides, "turbo.enable=true"]}
    names = ("primus", "torchtitan", "primus-turbo") if opts.turbo else ("primus", "torchtitan")
    results: dict[str, list[dict[str, float]]] = {name: [] for name in names}
    for i in range(opts.rounds):
        commands = {
            name: [sys.executable, "-m", "primus.cli", "train", "pretrain", "--config",
                   str(opts.config), *variants[name], f"exp_name=bench-{name}-{i}"]
            for name in names if name != "torchtitan"
        }  # fmt: skip
        commands["torchtitan"] = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1",
                 "-m", "torchtitan.train", "--module", "torchtitan_plain", "--config",
                 "llama3_1b_synthetic", "--dump-folder", str(logs / f"plain-{i}"), *flags]  # fmt: skip
        for name in names:
            text = run(commands[name], logs / f"{name}-{i}{'-compile' * opts.compile}.log", env)
            results[name].append(parse_log(text, opts.warmup))
    summary = {
        name: medians(runs, ("tokens_per_s_per_gpu", "tflops_per_gpu", "mfu"))
        | {"peak_memory_gib": max(r["peak_memory_gib"] for r in runs), "runs": runs}
        for name, runs in results.items()
    }
    peer = summary["torchtitan"]["tokens_per_s_per_gpu"]
    ratios = {
        f"{n.replace('-', '_')}_over_torchtitan": summary[n]["tokens_per_s_per_gpu"] / peer
        for n in names
        if n != "torchtitan"
    }
    dists = ("torch", "torchtitan", "primus-torchtitan")
    report = {
        **environment((*dists, "triton", "primus-turbo-kernels") if opts.turbo else dists),
        "config": str(opts.config),
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
