"""Fine-tuning against pretraining throughput, per backend, on the same GPU in one run.

    python tools/bench/bench_posttrain.py --backends megatron maxtext --steps 30 --out posttrain.json
    python tools/bench/bench_posttrain.py --backends megatron --dpo megatron --steps 20 --warmup 6

For each backend: `primus train pretrain` of `configs/<backend>/llama3.2_1B-pretrain.yaml`
and `primus train posttrain` of `configs/<backend>/llama3.2_1B-sft.yaml` (sequence 4096,
packing on), both for `--steps` steps, alternating `--rounds` times. The fine-tune starts from
a random HF model of Llama-3.2-1B's published shape (with the tests' tiny tokenizer) and
trains on chats of 20 to 400 words (the reverse task, about 60 to 1,000 tokens each), packed.
Both are measured by Primus's own step metrics (metrics.jsonl: tokens/s/GPU counts every
position of a row, padding included; peak GPU memory): the median after `--warmup` steps.
Goal: fine-tuning tokens/s >= 0.95x pretraining's. With `--lora BACKEND...`, a LoRA
fine-tune (rank 16, every projection) is measured too, for its step time and memory against
full fine-tuning (goal: LoRA tokens/s >= 1.1x full fine-tuning's); `--unpacked` runs both
with packing off. With `--dpo BACKEND...`,
two runs more (alone with an empty `--backends`): the SFT recipe with packing off, and the same recipe as DPO (`dpo: {beta: 0.1}`,
no eval) on preference pairs of the same reverse-task prompts (chosen: the words reversed,
rejected: as given), its batch sizes halved since DPO's count pairs of two rows: both train the
same number of rows of the same length a step, and that DPO again with
`dpo.precompute_reference: true` ("dpo-precomputed", its pass over the pairs before step 1
reported as `precompute_s`). Reported with the DPO runs' last loss and reward metrics. Goal:
DPO tokens/s >= 0.9x unpacked SFT's (its frozen reference's forward adds about a third of a
training step's compute: 0.75x at equal efficiency; precomputed, none). Every run logs each step and
saves no checkpoint. `--turbo` (with primus-turbo-kernels installed): `auto` (default) leaves
`turbo.enable` at its default (on on a GPU), `off` adds `turbo.enable=false` to every run,
`both` runs each job both ways ("megatron sft", "megatron sft turbo-off"), each ratio taken
within one setting. Each run's `[turbo]` log line is printed and kept in the report, which is
rewritten after every run. Results: docs/benchmarks/posttrain.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import device_label, environment, gpu_name, installed, print_table, resolved_params

ROOT = Path(__file__).resolve().parents[2]
COLUMNS = (
    ("tokens/s/GPU", "tokens_per_s_per_gpu", ",.0f"),
    ("ms/step", "step_ms", ".1f"),
    ("x pretrain", "vs_pretrain", ".3f"),
    ("x SFT", "vs_sft", ".3f"),
    ("x SFT unpacked", "vs_sft_unpacked", ".3f"),
    ("peak GiB", "peak_memory_gib", ".2f"),
)
LORA = "peft.type=lora peft.rank=16 peft.alpha=32"
SFT = "modules.post_trainer.sft"
# every run: a step line a step, no checkpoint (a 1B run's optimizer state is 14 GB)
EVERY = {"megatron": ["log_interval=1", "save_interval=null"],
         "torchtitan": ["metrics.log_freq=1", "checkpoint.enable=false"]}  # fmt: skip
OFF = " turbo-off"  # the label's suffix for a run with turbo.enable=false
PRECOMPUTE = "modules.post_trainer.dpo.precompute_reference=true"
RATIOS = (("vs_pretrain", "pretrain"), ("vs_sft", "sft"), ("vs_sft_unpacked", "sft-unpacked"))
REWARDS = ("loss", "reward_margin", "reward_accuracy", "reward_chosen", "reward_rejected")


def make_inputs(work: Path, model: str, samples: int, words: int) -> tuple[Path, Path]:
    """A random HF model (`model`: a published config's name, or `tiny`, the tests' tiny
    Llama 3) with the tiny test tokenizer, `samples` chats of the reverse task (and 64 for eval)
    and `samples` preference pairs of it (chosen: the words reversed, rejected: as given, as
    `primus.testing.dpo.write_preference_task` writes them), 20 to `words` words each (made in
    a child process: this one holds no tensors)."""
    hf, data = work / "hf", work / "data"
    if (data / "preference_train.jsonl").is_file():  # an earlier run's, in the same --work
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
with (data / "preference_train.jsonl").open("w") as f:
    for words in reverse_task({samples}, 2, min({words}, 20), {words}):
        if words != words[::-1]:  # two answers that differ
            record = {{"prompt": [{{"role": "user", "content": " ".join(words)}}],
                      "chosen": [{{"role": "assistant", "content": " ".join(reversed(words))}}],
                      "rejected": [{{"role": "assistant", "content": " ".join(words)}}]}}
            f.write(json.dumps(record) + "\\n")
"""
    subprocess.run([sys.executable, "-c", make], check=True, cwd=ROOT)
    return hf, data


def as_dpo(recipe: Path, data: Path) -> list[str]:
    """The overrides that make an SFT recipe DPO at the same rows a step: the preference pairs,
    packing and eval off, and the batch sizes halved (DPO's count pairs, two rows each)."""
    params = resolved_params(recipe)
    batch, prefix = (params["training"], "training.") if "training" in params else (params, "")
    keys = ("micro_batch_size", "local_batch_size", "global_batch_size")
    halved = [f"{prefix}{k}={max(batch[k] // 2, 1)}" for k in keys if (batch.get(k) or 0) > 0]
    return [f"{SFT}.train={data / 'preference_train.jsonl'}", f"{SFT}.packing=false",
            f"{SFT}.eval=null", f"{SFT}.eval_fraction=0", "modules.post_trainer.dpo.beta=0.1",
            *halved]  # fmt: skip


def train(stage: str, recipe: Path, work: Path, name: str, *overrides: str) -> tuple[Path, str]:
    """One `primus train` run; its run directory and its log's turbo line."""
    env = {**os.environ, "PRIMUS_WORKSPACE": str(work / "runs"), "PRIMUS_EXP_NAME": name}
    command = [sys.executable, "-m", "primus.cli", "train", stage, "--config", str(recipe),
               *overrides]  # fmt: skip
    print("$", " ".join(command), flush=True)
    log, start = work / f"{name}.log", time.monotonic()
    with log.open("w") as out:
        done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    if done.returncode:
        raise SystemExit(f"failed ({done.returncode}); see {log}:\n{log.read_text()[-3000:]}")
    turbo = next((line for line in log.read_text().splitlines() if "[turbo]" in line), "")
    print(f"{time.monotonic() - start:.0f} s;", turbo or "no [turbo] line in the log", flush=True)
    return next((work / "runs").rglob(name)), turbo.split("[turbo]", 1)[-1].strip()


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
    if (
        steps[-1].get("reward_margin") is not None
    ):  # DPO: the last step's loss and rewards, a sanity check
        result |= {f"last_{key}": steps[-1].get(key) for key in REWARDS}
    precomputed = re.search(r"precomputed in ([\d.]+) s", (run / "logs" / "rank-0.log").read_text())
    if precomputed:  # DPO with dpo.precompute_reference: the reference's pass before step 1
        result["precompute_s"] = float(precomputed.group(1))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", nargs="*", default=["megatron", "torchtitan", "maxtext"])
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
    parser.add_argument(
        "--dpo", nargs="*", default=[], help="backends whose DPO and unpacked SFT are measured too"
    )
    parser.add_argument(
        "--turbo", choices=("auto", "off", "both"), default="auto",
        help="turbo.enable: auto (its default), off (false), or both, side by side",
    )  # fmt: skip
    parser.add_argument(
        "--unpacked", action="store_true", help="fine-tune (SFT and LoRA) with packing off"
    )
    parser.add_argument("--work", type=Path, default=None, help="scratch folder (default: tmp)")
    parser.add_argument("--out", type=Path, default=None, help="JSON report (default: stdout)")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-posttrain-"))
    hf, data = make_inputs(work, args.model, args.samples, args.words)
    os.environ |= {"PRIMUS_SFT_HF": str(hf), "PRIMUS_SFT_DATA": str(data)}
    runs: dict[str, list[dict[str, Any]]] = {}
    text = ""
    device = device_label() or gpu_name()  # no CUDA context here: the runs need the memory
    settings = {"auto": [""], "off": [OFF], "both": ["", OFF]}[args.turbo]
    for backend in dict.fromkeys([*args.backends, *args.dpo]):
        pretrain, sft = (ROOT / "configs" / backend / f"{name}.yaml" for name in args.recipes)
        steps = {"megatron": "train_iters", "torchtitan": "training.steps"}.get(backend, "steps")
        every = EVERY.get(backend, [])
        tuned = [*every, f"{SFT}.packing=false"] if args.unpacked else every
        jobs: dict[str, tuple[str, Path, list[str]]] = {}
        if backend in args.dpo:
            jobs["sft-unpacked"] = ("posttrain", sft, [*every, f"{SFT}.packing=false"])
            jobs["dpo"] = ("posttrain", sft, [*every, *as_dpo(sft, data)])
            jobs["dpo-precomputed"] = ("posttrain", sft, [*every, *as_dpo(sft, data), PRECOMPUTE])
        if backend in args.backends:
            jobs |= {"pretrain": ("pretrain", pretrain, every), "sft": ("posttrain", sft, tuned)}
        if backend in args.lora:
            jobs["lora"] = ("posttrain", sft, [*tuned, *LORA.split()])
        for round_ in range(args.rounds):
            for suffix in settings:  # every job with turbo auto, then every one without
                off = ["turbo.enable=false"] if suffix and installed("primus-turbo-kernels") else []
                for job, (stage, recipe, extra) in jobs.items():
                    label = f"{backend} {job}{suffix}"
                    name = label.replace(" ", "-") + f"-{round_}"
                    run, turbo = train(stage, recipe, work, name, f"{steps}={args.steps}",
                                       *extra, *off)  # fmt: skip
                    runs.setdefault(label, []).append(measure(run, args.warmup) | {"turbo": turbo})
                    print(f"{label}: {runs[label][-1]}", flush=True)
                    text = report(runs, args, work, device)  # kept if a later run fails
    if not args.out:
        print(text)


def report(runs: dict[str, list[dict[str, Any]]], args: argparse.Namespace, work: Path,
           device: str) -> str:  # fmt: skip
    """Medians over rounds, ratios within one turbo setting; the JSON report (written to
    `--out`, returned) and the table (printed)."""
    results: dict[str, Any] = {}
    for label, measured in runs.items():
        values = {k: [m[k] for m in measured if m[k] is not None] for k in measured[0]}
        results[label] = {k: statistics.median(v) if v else None for k, v in values.items()
                          if k != "turbo"} | {"turbo": measured[-1]["turbo"]}  # fmt: skip
    for label, values in results.items():
        suffix = OFF if label.endswith(OFF) else ""
        for key, base in RATIOS:
            against = results.get(f"{label.split()[0]} {base}{suffix}", {})
            tokens = against.get("tokens_per_s_per_gpu")
            values[key] = round(values["tokens_per_s_per_gpu"] / tokens, 3) if tokens else None
    distributions = ("primus-core", "primus-turbo-kernels", "torch", "triton", "megatron-core",
                     "torchtitan", "maxtext", "jax")  # fmt: skip
    doc = {**environment(distributions, device), "args": vars(args) | {"work": str(work), "out": str(args.out)},
           "results": results}  # fmt: skip
    text = json.dumps(doc, indent=2, default=str)
    if args.out:
        args.out.write_text(text + "\n")
    print_table(results, COLUMNS, "goals: fine-tuning tokens/s >= 0.95x pretraining's; "
                "LoRA's >= 1.1x SFT's; DPO's >= 0.9x unpacked SFT's")  # fmt: skip
    return text


if __name__ == "__main__":
    main()
