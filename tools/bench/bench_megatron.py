"""Primus vs plain megatron-core on the same GPU, same model, same flags, in one run.

    python tools/bench/bench_megatron.py --config configs/megatron/llama3.2_1B-pretrain.yaml \
        --iters 25 --warmup 5 --rounds 1 --out bench.json

Runs `primus train pretrain --config ...` and tools/bench/megatron_plain.py (no Primus) with the
flags the resolved experiment stands for, alternating, `--rounds` times each. `--turbo` adds a
third run, Primus with `turbo.enable=true` (primus-turbo-kernels installed). Both runs are
measured by Megatron's own log line (elapsed time per iteration, TFLOP/s/GPU by Megatron's
count), so the two numbers come from the same clock and the same formula; the first
`--warmup` iterations are dropped and the median is taken. Prints a Markdown table and
writes the raw numbers as JSON.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path
from typing import Any

from common import COLUMNS, environment, medians, print_table, resolved_params, run

HERE = Path(__file__).resolve().parent
# What Primus's fallback patches do without Transformer Engine/Apex, as a plain user writes it.
NO_TE_FLAGS = [
    "--transformer-impl", "local", "--no-rope-fusion", "--no-masked-softmax-fusion",
    "--no-gradient-accumulation-fusion", "--no-persist-layer-norm",
]  # fmt: skip
ITERATION = re.compile(r"iteration\s+(\d+)/\s*\d+ \|.*?elapsed time per iteration \(ms\): ([\d.]+)")
TFLOPS = re.compile(r"throughput per GPU \(TFLOP/s/GPU\): ([\d.]+)")
MEMORY = re.compile(r"max allocated: ([\d.]+)")


def megatron_flags(params: dict[str, Any]) -> list[str]:
    """The Megatron command line for `params` (dest names) through Megatron's own parser."""
    from primus.backends.megatron.config_bridge import megatron_actions

    actions, flags = megatron_actions(), []
    for key, value in params.items():
        if key not in actions or value is None:  # Primus's own keys are no Megatron flags
            continue
        action = actions[key]
        option = action.option_strings[0]
        if action.nargs == 0:  # store_true / store_false: the flag when it changes the default
            if value != action.default:
                flags.append(option)
        elif isinstance(value, list):
            flags += [option, *map(str, value)]
        else:
            flags += [option, str(value)]
    return flags + NO_TE_FLAGS + ["--mock-data", "--tokenizer-type", "NullTokenizer"]


def parse_log(text: str, warmup: int) -> dict[str, float]:
    times, tflops = [], []
    for line in text.splitlines():
        step = ITERATION.search(line)
        flops = TFLOPS.search(line)
        if step and flops and int(step.group(1)) > warmup:
            times.append(float(step.group(2)))
            tflops.append(float(flops.group(1)))
    if not times:
        raise SystemExit("no iteration lines after warm-up in:\n" + text[-3000:])
    memory = [float(m) for m in MEMORY.findall(text)]
    return {
        "ms_per_iter": statistics.median(times),
        "tflops_per_gpu": statistics.median(tflops),
        "iterations_measured": len(times),
        "peak_memory_gib": max(memory) / 1024 if memory else float("nan"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--iters", type=int, default=25)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--turbo", action="store_true", help="also run Primus with turbo on")
    parser.add_argument("--out", type=Path, default=Path("megatron-bench.json"))
    opts = parser.parse_args()
    params = resolved_params(opts.config)
    params.update(train_iters=opts.iters, log_interval=1, log_throughput=True, eval_iters=0)
    flags = megatron_flags(params)
    overrides = [f"train_iters={opts.iters}", "log_interval=1", "log_throughput=true"]
    logs = opts.out.parent
    variants = {"primus": overrides, "primus-turbo": [*overrides, "turbo.enable=true"]}
    names = ("primus", "plain", "primus-turbo") if opts.turbo else ("primus", "plain")
    results: dict[str, list[dict[str, float]]] = {name: [] for name in names}
    for i in range(opts.rounds):
        commands = {
            name: [sys.executable, "-m", "primus.cli", "train", "pretrain", "--config",
                   str(opts.config), *variants[name], f"exp_name=bench-{name}-{i}"]
            for name in names if name != "plain"
        }  # fmt: skip
        # Primus writes tensorboard into the run directory by default: the peer does the same.
        commands["plain"] = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1",
                 str(HERE / "megatron_plain.py"), *flags,
                 "--tensorboard-dir", str(logs / f"plain-tensorboard-{i}")]  # fmt: skip
        for name in names:
            text = run(commands[name], logs / f"{name}-{i}.log")
            results[name].append(parse_log(text, opts.warmup))
    tokens = params["global_batch_size"] * params["seq_length"]
    peak = 989.0  # dense bf16 of H100 SXM and H200; see primus.core.metrics
    summary = {}
    for name, runs in results.items():
        summary[name] = medians(runs, ("ms_per_iter", "tflops_per_gpu"))
        summary[name]["tokens_per_s_per_gpu"] = tokens / (summary[name]["ms_per_iter"] / 1000)
        summary[name]["mfu"] = summary[name]["tflops_per_gpu"] / peak
        summary[name]["peak_memory_gib"] = max(r["peak_memory_gib"] for r in runs)
        summary[name]["runs"] = runs
    plain_rate = summary["plain"]["tokens_per_s_per_gpu"]
    ratios = {
        f"{n.replace('-', '_')}_over_plain": summary[n]["tokens_per_s_per_gpu"] / plain_rate
        for n in names
    }
    del ratios["plain_over_plain"]
    dists = ("torch", "megatron-core", "primus-megatron")
    report = {
        **environment((*dists, "triton", "primus-turbo-kernels") if opts.turbo else dists),
        "config": str(opts.config),
        "plain_flags": flags,
        **ratios,
        **summary,
    }
    opts.out.write_text(json.dumps(report, indent=2))
    columns = (("ms/iter", "ms_per_iter", ".1f"), *COLUMNS)
    print_table(summary, columns, ", ".join(f"{k} (tokens/s): {v:.4f}" for k, v in ratios.items()))


if __name__ == "__main__":
    main()
