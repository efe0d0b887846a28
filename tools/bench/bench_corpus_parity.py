"""One HF initial model, one prepared corpus, one schedule, through each backend's recipe: the
loss of every step on each backend and the largest relative gap between every pair.

Each experiment is the backend's recipe with the same `init_from`, `data:` section and schedule
(a constant learning rate, no warm-up, no weight decay, gradients clipped at 1.0, the recipe's
sequence length and a global batch of 8 in one process); only `framework:` and each backend's
names for the schedule's keys differ. Runs are kept in --work, so backends needing different
environments run in separate calls and `--compare` reads them all:

    python tools/bench/bench_corpus_parity.py --work /tmp/parity --model llama3.2_1B \\
        --steps 200 --backend megatron --backend maxtext
    python tools/bench/bench_corpus_parity.py --work /tmp/parity --backend torchtitan ...
    python tools/bench/bench_corpus_parity.py --work /tmp/parity --compare --out parity.json

`--model tiny --recipe tiny-cpu.yaml --seq 32` is the same on CPU in a few minutes.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from bench_data_prepare import make_corpus
from common import environment

from primus.testing.runs import losses
from primus.testing.sft_runs import run_dir

ROOT = Path(__file__).resolve().parents[2]
BACKENDS = ("megatron", "torchtitan", "maxtext")
LR, BATCH = 1.0e-4, 8


def schedule(backend: str, steps: int) -> dict[str, Any]:
    """The backend's keys for the shared schedule, and per-step losses without checkpoints."""
    return {
        "megatron": {
            "train_iters": steps, "micro_batch_size": 1, "global_batch_size": BATCH, "lr": LR,
            "min_lr": LR, "lr_decay_style": "constant", "lr_warmup_iters": 0,
            "weight_decay": 0.0, "clip_grad": 1.0, "log_interval": 1, "save_interval": None,
        },
        "torchtitan": {
            "mock_data": False,
            "training": {"steps": steps, "local_batch_size": BATCH, "max_norm": 1.0},
            "optimizer": {"lr": LR, "weight_decay": 0.0},
            "lr_scheduler": {"warmup_steps": 0, "min_lr_factor": 1.0},
            "metrics": {"log_freq": 1}, "checkpoint": {"enable": False},
        },
        "maxtext": {
            "steps": steps, "per_device_batch_size": BATCH, "learning_rate": LR,
            "warmup_steps_fraction": 0.0, "learning_rate_final_fraction": 1.0,
            "adam_weight_decay": 0.0, "gradient_clipping_threshold": 1.0,
            "enable_checkpointing": False, "log_period": 1,
        },
    }[backend]  # fmt: skip


def prepare(work: Path, model: str, megabytes: float) -> None:
    """The HF initial model (random, of the published config `model`) and a prepared corpus of
    about `megabytes` of text (`bench_data_prepare.make_corpus`), made once per --work. `tiny`:
    the tests' tiny Llama 3 and their reverse-task corpus, which fits its vocabulary of 256.
    Made in child processes: this one holds no tensors."""
    hf, prefix = work / "hf", work / "corpus" / "corpus"
    tiny = model == "tiny"
    if not hf.is_dir():
        make = (
            "from pathlib import Path; from primus.testing.hf_models import make_hf_model, "
            f"make_published_model; hf = Path({str(hf)!r}); "
            f"make_hf_model(hf, 'llama3') if {tiny} else make_published_model(hf, {model!r})"
        )
        subprocess.run([sys.executable, "-c", make], check=True)
    if prefix.with_suffix(".bin").is_file():
        return
    if tiny:
        make = (
            "from pathlib import Path; from primus.testing.corpus import prepared_reverse_task; "
            f"prepared_reverse_task(Path({str(prefix)!r}), 2000, 0, 40)"
        )
        subprocess.run([sys.executable, "-c", make], check=True)
        return
    prefix.parent.mkdir(parents=True, exist_ok=True)
    text, tokenizer = make_corpus(prefix.parent, megabytes)
    subprocess.run([sys.executable, "-m", "primus.cli", "data", "prepare", "-i", str(text),
                    "-t", str(tokenizer), "-o", str(prefix)], check=True)  # fmt: skip


def train(work: Path, backend: str, recipe: str, steps: int, seq: int | None, tiny: bool,
          overrides: list[str]) -> Path:  # fmt: skip
    """The backend's recipe with the shared model, corpus and schedule (`tiny`: the tests'
    tiny Llama 3's preset) and the command line's `overrides`; its run directory."""
    hf, prefix = work / "hf", work / "corpus" / "corpus"
    module: dict[str, Any] = {"init_from": {"hf": str(hf)}, "overrides": schedule(backend, steps),
                              "data": {"path": str(prefix)} | ({"seq_length": seq} if seq else {})}  # fmt: skip
    if tiny:
        module["model"] = "tiny_llama3"
    experiment = {"extends": str(ROOT / "configs" / backend / recipe), "workspace": str(work / "runs"),
                  "exp_name": backend, "modules": {"pre_trainer": module}}  # fmt: skip
    path = work / f"{backend}.yaml"
    path.write_text(yaml.safe_dump(experiment, sort_keys=False))
    log = work / f"{backend}.log"
    print(f"$ primus train pretrain --config {path}  (log: {log})", flush=True)
    with log.open("w") as out:
        done = subprocess.run(
            [sys.executable, "-m", "primus.cli", "train", "pretrain", "--config", str(path),
             *overrides],
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    if done.returncode:
        raise SystemExit(f"{backend} failed ({done.returncode}):\n{log.read_text()[-3000:]}")
    return run_dir(path)


def compare(work: Path) -> dict[str, Any]:
    """Each backend's curve and, for every pair, the largest relative gap over the steps both
    logged (and the step), plus the gap's median."""
    curves = {
        backend: losses(run_dir(work / f"{backend}.yaml"))
        for backend in BACKENDS
        if (work / f"{backend}.yaml").is_file()
    }
    pairs = {}
    for a, b in itertools.combinations(curves, 2):
        steps = sorted(set(curves[a]) & set(curves[b]))
        gaps = {s: abs(curves[a][s] / curves[b][s] - 1) for s in steps}
        worst = max(gaps, key=gaps.__getitem__)
        ordered = sorted(gaps.values())
        pairs[f"{a}/{b}"] = {"steps": len(steps), "max_rel_gap": gaps[worst], "at_step": worst,
                             "median_rel_gap": ordered[len(ordered) // 2]}  # fmt: skip
    return {"curves": curves, "pairs": pairs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, required=True, help="model, corpus and runs")
    parser.add_argument("--backend", action="append", choices=BACKENDS, default=[])
    parser.add_argument("--model", default="llama3.2_1B", help="an HF_CONFIGS key, or tiny")
    parser.add_argument("--recipe", default="llama3.2_1B-pretrain.yaml", help="in configs/B/")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--seq", type=int, help="sequence length (default: the recipe's)")
    parser.add_argument("--override", action="append", default=[], help="KEY=VALUE, each run")
    parser.add_argument("--corpus-mb", type=float, default=100.0)
    parser.add_argument("--compare", action="store_true", help="compare the runs in --work")
    parser.add_argument("--out", type=Path, help="the comparison's JSON")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    if args.backend:
        prepare(args.work, args.model, args.corpus_mb)
    for backend in args.backend:
        run = train(
            args.work,
            backend,
            args.recipe,
            args.steps,
            args.seq,
            args.model == "tiny",
            args.override,
        )
        print(f"{backend}: {len(losses(run))} steps logged in {run}", flush=True)
    if args.compare:
        report = compare(args.work)
        for pair, gap in report["pairs"].items():
            print(f"{pair}: max {gap['max_rel_gap']:.2e} at step {gap['at_step']}, "
                  f"median {gap['median_rel_gap']:.2e} over {gap['steps']} steps")  # fmt: skip
        if args.out:
            report |= environment(("torch", "megatron-core", "torchtitan", "maxtext", "jax"),
                                  device=os.environ.get("PARITY_DEVICE", "see the runs' logs"))  # fmt: skip
            args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
