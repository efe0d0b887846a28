"""Fine-tuning against pretraining throughput, per backend, on the same GPU in one run.

    python tools/bench/bench_posttrain.py --backends megatron maxtext --steps 30 --out posttrain.json

For each backend: `primus train pretrain` of `configs/<backend>/llama3.2_1B-pretrain.yaml`
and `primus train posttrain` of `configs/<backend>/llama3.2_1B-sft.yaml` (sequence 4096,
packing on), both for `--steps` steps, alternating `--rounds` times. The fine-tune starts from
a random HF model of Llama-3.2-1B's published shape (with the tests' tiny tokenizer) and
trains on chats of 20 to 400 words (the reverse task, about 60 to 1,000 tokens each), packed.
Both are measured by Primus's own step metrics (metrics.jsonl: tokens/s/GPU counts every
position of a row, padding included; peak GPU memory): the median after `--warmup` steps.
Goal: fine-tuning tokens/s >= 0.95x pretraining's. With `--lora BACKEND...`, a
LoRA fine-tune (rank 16, every projection) is measured too, for its step time and memory against
full fine-tuning. Results: docs/benchmarks/posttrain.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from common import device_label, environment, print_table

ROOT = Path(__file__).resolve().parents[2]
COLUMNS = (
    ("tokens/s/GPU", "tokens_per_s_per_gpu", ",.0f"),
    ("ms/step", "step_ms", ".1f"),
    ("x pretrain", "vs_pretrain", ".3f"),
    ("peak GiB", "peak_memory_gib", ".2f"),
)
LORA = "peft.type=lora peft.rank=16 peft.alpha=32"


def make_inputs(work: Path, model: str, samples: int, words: int) -> tuple[Path, Path]:
    """A random HF model (`model`: a published config's name, or `tiny`, the tests' tiny
    Llama 3) with the tiny test tokenizer, and `samples` chats of the reverse task (and 64 for eval), 20 to
    `words` words each (made in a child process: this one holds no tensors)."""
    hf, data = work / "hf", work / "data"
    if (data / "chat_train.jsonl").is_file():  # an earlier run's, in the same --work
        return hf, data
    make = f"""
import json, sys
from pathlib import Path
from primus.testing.hf_models import make_hf_model, make_published_model
from primus.testing.sft_data import reverse_task, write_tokenizer
hf, data = Path({str(hf)!r}), Path({str(data)!r})
if {model!r} == "tiny":
    make_hf_model(hf, "llama3")
else:
    make_published_model(hf, {model!r})
write_tokenizer(hf)
data.mkdir(parents=True, exist_ok=True)
for split, n, seed in (("train", {samples}, 0), ("eval", 64, 1)):
    with (data / f"chat_{{split}}.jsonl").open("w") as f:
        for words in reverse_task(n, seed, min({words}, 20), {words}):
            turns = [{{"role": "user", "content": " ".join(words)}},
                     {{"role": "assistant", "content": " ".join(reversed(words))}}]
            f.write(json.dumps({{"messages": turns}}) + "\\n")
"""
    subprocess.run([sys.executable, "-c", make], check=True, cwd=ROOT)
    return hf, data


def train(stage: str, recipe: Path, work: Path, name: str, *overrides: str) -> Path:
    """One `primus train` run; its run directory."""
    env = {**os.environ, "PRIMUS_WORKSPACE": str(work / "runs"), "PRIMUS_EXP_NAME": name,
           "PRIMUS_SFT_HF": str(work / "hf"), "PRIMUS_SFT_DATA": str(work / "data")}  # fmt: skip
    command = [sys.executable, "-m", "primus.cli", "train", stage, "--config", str(recipe),
               *overrides]  # fmt: skip
    print("$", " ".join(command), flush=True)
    log = work / f"{name}.log"
    with log.open("w") as out:
        done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    if done.returncode:
        raise SystemExit(f"failed ({done.returncode}); see {log}:\n{log.read_text()[-3000:]}")
    return next((work / "runs").rglob(name))


def measure(run: Path, warmup: int) -> dict[str, float | None]:
    """Medians of the run's step metrics after `warmup` steps."""
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    kept = [s for s in steps if s["step"] > warmup] or steps
    result: dict[str, float | None] = {
        "tokens_per_s_per_gpu": statistics.median(s["tokens_per_s_per_gpu"] for s in kept),
        "step_ms": statistics.median(s["step_seconds"] for s in kept) * 1000,
        "steps": len(kept),
    }
    peaks = [s["peak_memory_gib"] for s in kept if s.get("peak_memory_gib") is not None]
    result["peak_memory_gib"] = max(peaks) if peaks else None
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", nargs="+", default=["megatron", "torchtitan", "maxtext"])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=10, help="steps left out of the medians")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--samples", type=int, default=20000, help="chats in the SFT data")
    parser.add_argument("--words", type=int, default=400, help="the longest chat's prompt words")
    parser.add_argument("--model", default="llama3.2_1B", help="an HF_CONFIGS key, or tiny")
    parser.add_argument(
        "--recipes",
        nargs=2,
        default=["llama3.2_1B-pretrain", "llama3.2_1B-sft"],
        help="configs/<backend>/<NAME>.yaml for pretraining and fine-tuning "
        "(tiny-cpu sft-tiny-cpu with --model tiny on a CPU machine)",
    )
    parser.add_argument(
        "--lora", nargs="*", default=[], help="backends whose LoRA fine-tune is measured too"
    )
    parser.add_argument("--work", type=Path, default=None, help="scratch folder (default: tmp)")
    parser.add_argument("--out", type=Path, default=None, help="JSON report (default: stdout)")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-posttrain-"))
    make_inputs(work, args.model, args.samples, args.words)
    runs: dict[str, list[dict[str, float | None]]] = {}
    for backend in args.backends:
        recipes = ROOT / "configs" / backend
        steps = {"megatron": "train_iters", "torchtitan": "training.steps"}.get(backend, "steps")
        every = ["log_interval=1"] if backend == "megatron" else []  # a step line per step
        jobs = {
            "pretrain": ("pretrain", recipes / f"{args.recipes[0]}.yaml", every),
            "sft": ("posttrain", recipes / f"{args.recipes[1]}.yaml", every),
        }
        if backend in args.lora:
            jobs["lora"] = ("posttrain", jobs["sft"][1], [*jobs["sft"][2], *LORA.split()])
        for round_ in range(args.rounds):
            for job, (stage, recipe, extra) in jobs.items():
                name = f"{backend}-{job}-{round_}"
                run = train(stage, recipe, work, name, f"{steps}={args.steps}", *extra)
                runs.setdefault(f"{backend} {job}", []).append(measure(run, args.warmup))
    results: dict[str, Any] = {}
    for label, measured in runs.items():
        values = {k: [m[k] for m in measured if m[k] is not None] for k in measured[0]}
        results[label] = {k: statistics.median(v) if v else None for k, v in values.items()}
    for label, values in results.items():
        pretrain = results[label.split()[0] + " pretrain"]["tokens_per_s_per_gpu"]
        values["vs_pretrain"] = round(values["tokens_per_s_per_gpu"] / pretrain, 3)
    distributions = ("primus-core", "torch", "megatron-core", "torchtitan", "maxtext", "jax")
    device = device_label()
    report = {**environment(distributions, device), "args": vars(args) | {"work": str(work), "out": str(args.out)},
              "results": results}  # fmt: skip
    text = json.dumps(report, indent=2, default=str)
    (args.out.write_text(text + "\n") if args.out else print(text))
    print_table(results, COLUMNS, "goal: fine-tuning tokens/s >= 0.95x pretraining's")


if __name__ == "__main__":
    main()
