"""Primus vs plain megatron-core on the same GPU, same model, same flags, in one run.

    python tools/bench/bench_megatron.py --config configs/megatron/llama3.2_1B-pretrain.yaml \
        --iters 25 --warmup 5 --rounds 1 --out bench.json

Runs `primus train pretrain --config ...` (`turbo.enable=false`) and tools/bench/megatron_plain.py
(no Primus) with the flags the resolved experiment stands for, alternating, `--rounds` times
each. `--turbo` adds a third run, Primus with `turbo.enable=true` (primus-turbo-kernels
installed); `--runs` picks any of the three. `--gpus N` runs each on N GPUs of the host, and
trailing `key=value` overrides go to every run (Megatron's names). The runs are
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

from common import (
    COLUMNS,
    MFU_COLUMNS,
    environment,
    gpu_name,
    medians,
    mfu_both_ways,
    print_table,
    resolved_params,
    run,
)

HERE = Path(__file__).resolve().parent
# What Primus's fallback patches do without Transformer Engine/Apex, as a plain user writes it.
NO_TE_FLAGS = [
    "--transformer-impl", "local", "--no-rope-fusion", "--no-masked-softmax-fusion",
    "--no-gradient-accumulation-fusion", "--no-persist-layer-norm",
]  # fmt: skip
ITERATION = re.compile(r"iteration\s+(\d+)/\s*\d+ \|.*?elapsed time per iteration \(ms\): ([\d.]+)")
TFLOPS = re.compile(r"throughput per GPU \(TFLOP/s/GPU\): ([\d.]+)")
MEMORY = re.compile(r"max allocated: ([\d.]+)")
RUNS = ("primus", "plain", "primus-turbo")  # Primus without and with turbo kernels, and the peer


def megatron_flags(params: dict[str, Any]) -> list[str]:
    """The Megatron command line for `params` (dest names) through Megatron's own parser."""
    from primus.backends.megatron.config.bridge import megatron_actions

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


def model_shape(params: dict[str, Any]) -> dict[str, int]:
    """The dense decoder's shape, for flops_per_token, from Megatron's resolved args."""
    return {
        "layers": params["num_layers"],
        "hidden": params["hidden_size"],
        "ffn": params["ffn_hidden_size"],
        "heads": params["num_attention_heads"],
        "kv_heads": params.get("num_query_groups") or params["num_attention_heads"],
        "vocab": params["vocab_size"],
        "seq": params["seq_length"],
    }


def main() -> None:
    from primus.core.metrics import peak_tflops

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--iters", type=int, default=25)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--gpus", type=int, default=1, help="processes (GPUs) of one host")
    parser.add_argument("--runs", nargs="+", choices=RUNS, default=["primus", "plain"])
    parser.add_argument("--turbo", action="store_true", help="also run Primus with turbo on")
    parser.add_argument("--out", type=Path, default=Path("megatron-bench.json"))
    parser.add_argument("overrides", nargs="*", help="key=value for both runs (Megatron's names)")
    opts = parser.parse_args()
    if opts.turbo and "primus-turbo" not in opts.runs:
        opts.runs.append("primus-turbo")
    device = gpu_name()
    params = resolved_params(opts.config, opts.overrides)
    params.update(train_iters=opts.iters, log_interval=1, log_throughput=True, eval_iters=0)
    flags = megatron_flags(params)
    overrides = [
        *opts.overrides,
        f"train_iters={opts.iters}",
        "log_interval=1",
        "log_throughput=true",
    ]
    logs = opts.out.parent
    logs.mkdir(parents=True, exist_ok=True)
    variants = {"primus": "turbo.enable=false", "primus-turbo": "turbo.enable=true"}
    results: dict[str, list[dict[str, float]]] = {name: [] for name in opts.runs}
    for i in range(opts.rounds):
        commands = {
            name: [sys.executable, "-m", "primus.cli", "train", "pretrain", "--config",
                   str(opts.config), "--nproc-per-node", str(opts.gpus), *overrides,
                   variants[name], f"exp_name=bench-{name}-{i}"]
            for name in opts.runs if name != "plain"
        }  # fmt: skip
        # Primus writes tensorboard into the run directory by default: the peer does the same.
        commands["plain"] = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node",
                 str(opts.gpus), str(HERE / "megatron_plain.py"), *flags,
                 "--tensorboard-dir", str(logs / f"plain-tensorboard-{i}")]  # fmt: skip
        for name in opts.runs:
            text = run(commands[name], logs / f"{name}-{i}.log")
            results[name].append(parse_log(text, opts.warmup))
    tokens = params["global_batch_size"] * params["seq_length"] / opts.gpus
    peak = peak_tflops(device)
    summary = {}
    for name, runs in results.items():
        summary[name] = medians(runs, ("ms_per_iter", "tflops_per_gpu"))
        summary[name]["tokens_per_s_per_gpu"] = tokens / (summary[name]["ms_per_iter"] / 1000)
        summary[name]["mfu"] = summary[name]["tflops_per_gpu"] / peak if peak else None
        summary[name] |= mfu_both_ways(
            summary[name]["tokens_per_s_per_gpu"], model_shape(params), peak
        )
        summary[name]["peak_memory_gib"] = max(r["peak_memory_gib"] for r in runs)
        summary[name]["runs"] = runs
    ratios = {
        f"{n.replace('-', '_')}_over_plain": summary[n]["tokens_per_s_per_gpu"]
        / summary["plain"]["tokens_per_s_per_gpu"]
        for n in opts.runs
        if n != "plain" and "plain" in opts.runs
    }
    dists = ("torch", "megatron-core", "primus-megatron", "triton", "primus-turbo-kernels")
    report = {
        **environment(dists, device),
        "config": str(opts.config),
        "gpus": opts.gpus,
        "overrides": opts.overrides,
        "plain_flags": flags,
        **ratios,
        **summary,
    }
    opts.out.write_text(json.dumps(report, indent=2))
    columns = (("ms/iter", "ms_per_iter", ".1f"), *COLUMNS[:3], *MFU_COLUMNS, COLUMNS[3])
    print_table(summary, columns, ", ".join(f"{k} (tokens/s): {v:.4f}" for k, v in ratios.items()))


if __name__ == "__main__":
    main()
