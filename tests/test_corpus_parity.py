"""One prepared corpus, one HF initial checkpoint, one schedule: pretraining through Megatron-LM
(its indexed data, natively) and through TorchTitan (`dataloader.dataset: indexed`, core's
`CorpusSamples`) on CPU in float32 logs the same loss at every step. Megatron does not log its
first step (its timers start there); every later step is compared."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from primus.core.data.prepare import Request, prepare
from primus.testing.runs import losses, primus
from primus.testing.sft_data import reverse_task
from primus.testing.sft_runs import REPO, SHIPPED, make_task, run_dir

pytestmark = pytest.mark.slow
STEPS = 100
SCHEDULE = {"lr": 1.0e-3, "seq": 32, "batch": 8}  # constant learning rate, no weight decay
OVERRIDES = {
    "megatron": {
        "device": "cpu", "bf16": False, "train_iters": STEPS,
        "global_batch_size": SCHEDULE["batch"], "micro_batch_size": SCHEDULE["batch"],
        "seq_length": SCHEDULE["seq"], "lr": SCHEDULE["lr"], "min_lr": SCHEDULE["lr"],
        "lr_decay_style": "constant", "lr_warmup_iters": 0, "weight_decay": 0.0,
        "clip_grad": 1.0, "split": "100,0,0", "tokenizer_type": "NullTokenizer",
        "vocab_size": 256, "log_interval": 1, "save_interval": 100000,
    },
    "torchtitan": {
        "device": "cpu",
        "training": {"steps": STEPS, "local_batch_size": SCHEDULE["batch"],
                     "seq_len": SCHEDULE["seq"], "dtype": "float32",
                     "mixed_precision_param": "float32", "max_norm": 1.0},
        "optimizer": {"lr": SCHEDULE["lr"], "weight_decay": 0.0},
        "lr_scheduler": {"warmup_steps": 0, "min_lr_factor": 1.0},
        "dataloader": {"dataset": "indexed"},
        "metrics": {"log_freq": 1},
        "activation_checkpoint": {"mode": "none"},
    },
}  # fmt: skip


def experiment(folder: Path, backend: str, hf: Path, corpus: Path) -> Path:
    overrides = json.loads(json.dumps(OVERRIDES[backend]))
    if backend == "megatron":
        overrides["data_path"] = [str(corpus)]
    else:
        overrides["dataloader"]["dataset_path"] = str(corpus)
    module = {"framework": backend, "config": f"{backend}_pretrain", "model": "tiny_llama3",
              "init_from": {"hf": str(hf)}, "overrides": overrides}  # fmt: skip
    exp = folder / f"{backend}.yaml"
    exp.write_text(yaml.safe_dump({"workspace": str(folder / "ws"), "exp_name": backend,
                                   "modules": {"pre_trainer": module}}))  # fmt: skip
    return exp


def test_megatron_and_torchtitan_pretrain_alike_on_one_prepared_corpus(tmp_path: Path) -> None:
    hf = make_task(tmp_path / "task")["hf"]
    text = tmp_path / "text.jsonl"
    text.write_text("".join(json.dumps({"text": " ".join(words)}) + "\n"
                            for words in reverse_task(2000, seed=5, max_words=40)))  # fmt: skip
    corpus = tmp_path / "corpus" / "c"
    prepare(Request([str(text)], REPO / SHIPPED / "tokenizer", corpus))
    curves = {}
    for backend in OVERRIDES:
        exp = experiment(tmp_path, backend, hf, corpus)
        run = primus("train", "pretrain", "--config", str(exp))
        assert run.returncode == 0, run.stderr[-3000:]
        curves[backend] = losses(run_dir(exp))
    megatron, torchtitan = curves["megatron"], curves["torchtitan"]
    assert sorted(megatron) == list(range(2, STEPS + 1)), sorted(megatron)
    assert curves["torchtitan"][STEPS] < curves["torchtitan"][1] - 1.0  # it learns
    for step, loss in megatron.items():
        assert torchtitan[step] == pytest.approx(loss, rel=1e-5), step  # 2e-7 measured
