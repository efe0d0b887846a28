"""One blend of two prepared corpora, one HF initial checkpoint, one schedule: pretraining
through Megatron-LM (its indexed data and blend, natively), through TorchTitan and through
MaxText (both reading core's `BlendedSamples`), on CPU in float32, each experiment naming its
data with the same `data:` section.

TorchTitan and MaxText log Megatron's loss at every step, and transformers trained with AdamW
logs it too, to 1e-5. (MaxText matches because Primus's import leaves attention's query scale
out of the weights: model/query_scale.py in primus-maxtext.) MaxText's run is stopped by SIGTERM
at about step 50 (it saves that step and exits 75), and the same command resumes it to step
100. Megatron does not log its first step (its timers start there); every later step is
compared."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from primus.core.data.blend import training_samples
from primus.testing.corpus import prepared_reverse_task
from primus.testing.faults import interrupt
from primus.testing.hf_models import hf_adamw_losses
from primus.testing.in_process import in_process, primus_here
from primus.testing.runs import losses
from primus.testing.sft_runs import make_task, run_dir

pytestmark = pytest.mark.slow
STEPS = 100
SCHEDULE = {"lr": 1.0e-3, "seq": 32, "batch": 8}  # constant learning rate, no weight decay
OVERRIDES = {
    "megatron": {
        "device": "cpu", "bf16": False, "train_iters": STEPS,
        "global_batch_size": SCHEDULE["batch"], "micro_batch_size": SCHEDULE["batch"],
        "lr": SCHEDULE["lr"], "min_lr": SCHEDULE["lr"],
        "lr_decay_style": "constant", "lr_warmup_iters": 0, "weight_decay": 0.0,
        "clip_grad": 1.0, "log_interval": 1, "save_interval": 100000,
    },
    "torchtitan": {
        "device": "cpu",
        "training": {"steps": STEPS, "local_batch_size": SCHEDULE["batch"], "dtype": "float32",
                     "mixed_precision_param": "float32", "max_norm": 1.0},
        "optimizer": {"lr": SCHEDULE["lr"], "weight_decay": 0.0},
        "lr_scheduler": {"warmup_steps": 0, "min_lr_factor": 1.0},
        "metrics": {"log_freq": 1},
        "activation_checkpoint": {"mode": "none"},
    },
    "maxtext": {
        "hardware": "cpu", "attention": "dot_product", "dtype": "float32",
        "steps": STEPS, "enable_checkpointing": True, "checkpoint_period": STEPS,
        "per_device_batch_size": SCHEDULE["batch"],
        "learning_rate": SCHEDULE["lr"], "warmup_steps_fraction": 0.0,
        "learning_rate_final_fraction": 1.0, "adam_weight_decay": 0.0,
        "gradient_clipping_threshold": 1.0,
    },
}  # fmt: skip


def experiment(folder: Path, backend: str, hf: Path, blend: list[dict[str, Any]]) -> Path:
    """The experiment: only `framework:` and the backend's schedule keys differ."""
    module = {"framework": backend, "config": f"{backend}_pretrain", "model": "tiny_llama3",
              "init_from": {"hf": str(hf)}, "data": {"path": blend, "seq_length": SCHEDULE["seq"]},
              "overrides": OVERRIDES[backend]}  # fmt: skip
    exp = folder / f"{backend}.yaml"
    exp.write_text(yaml.safe_dump({"workspace": str(folder / "ws"), "exp_name": backend,
                                   "modules": {"pre_trainer": module}}))  # fmt: skip
    return exp


def train(exp: Path, *overrides: str) -> dict[int, float]:
    """`primus train pretrain` of `exp` in this process (the frameworks imported once)."""
    with in_process():
        run = primus_here("train", "pretrain", "--config", str(exp), *overrides)
    assert run.returncode == 0, run.stderr[-3000:]
    return losses(run_dir(exp))


def test_megatron_torchtitan_and_maxtext_pretrain_alike_on_one_prepared_corpus(
    tmp_path: Path,
) -> None:
    hf = make_task(tmp_path / "task")["hf"]
    corpora = [(prepared_reverse_task(tmp_path / "corpus" / "a", 2000, 5, 40), 0.7),
               (prepared_reverse_task(tmp_path / "corpus" / "b", 300, 6, 20), 0.3)]  # fmt: skip
    blend = [{"path": str(prefix), "weight": weight} for prefix, weight in corpora]
    exps = {backend: experiment(tmp_path, backend, hf, blend) for backend in OVERRIDES}
    curves = {backend: train(exp) for backend, exp in exps.items() if backend != "maxtext"}
    megatron, torchtitan = curves["megatron"], curves["torchtitan"]
    assert sorted(megatron) == list(range(2, STEPS + 1)), sorted(megatron)
    assert curves["torchtitan"][STEPS] < curves["torchtitan"][1] - 1.0  # it learns
    for step, loss in megatron.items():
        assert torchtitan[step] == pytest.approx(loss, rel=1e-5), step  # 2e-7 measured
    command = ["train", "pretrain", "--config", str(exps["maxtext"])]
    stopped = interrupt(command, run_dir(exps["maxtext"]), signal.SIGTERM, at_step=STEPS // 2)
    assert stopped.preempted, stopped.stderr[-3000:]
    maxtext = train(exps["maxtext"])  # the same command: resumed after the stopped step
    log = (run_dir(exps["maxtext"]) / "logs" / "rank-0.log").read_text()
    position = 8 * stopped.marker["step"]  # type: ignore[index]  # the next step's first sample
    assert f"[maxtext] corpus samples from position {position}" in log
    assert sorted(maxtext) == list(range(1, STEPS + 1)), sorted(maxtext)
    assert maxtext[1] == pytest.approx(torchtitan[1], rel=1e-6)  # 1e-7 measured
    for step, loss in megatron.items():
        assert maxtext[step] == pytest.approx(loss, rel=1e-5), step  # 4e-7 measured
    batch, seq = SCHEDULE["batch"], SCHEDULE["seq"]
    samples = training_samples([(str(p), w) for p, w in corpora], seq, STEPS * batch, 1234)
    batches = [np.stack([samples[s * batch + i] for i in range(batch)]) for s in range(STEPS)]
    reference = hf_adamw_losses(hf, batches, SCHEDULE["lr"], 1.0)
    for name, curve in (("megatron", megatron), ("maxtext", maxtext)):
        for step, loss in curve.items():  # 2e-7 (Megatron), 4e-7 (MaxText) measured
            assert loss == pytest.approx(reference[step - 1], rel=1e-5), (name, step)
