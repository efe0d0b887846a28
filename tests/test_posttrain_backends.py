"""One fine-tune, several backends: the same tiny Llama-3 HF checkpoint, data and schedule
through Megatron-LM and through TorchTitan (their CPU recipes, shortened alike to 40 steps)
reach the same eval loss within 2% (5.7 -> about 3.36; measured 0.6% apart), and so does one
LoRA fine-tune (rank 8 on all seven projections) through Megatron-LM, TorchTitan and MaxText
(5.89 -> about 4.69; measured 0.25% apart). The task, the rows, the loss and the eval are
core's (docs/posttrain.md), so only the frameworks differ. Longer runs drift apart slowly
(float32 rounding differs between the frameworks: the recipes' schedule over 200 steps ends
about 7% apart in eval loss, on the same downward curve)."""

from __future__ import annotations

from pathlib import Path

import pytest

from primus.testing import sft_runs
from primus.testing.in_process import in_process
from primus.testing.sft_runs import eval_lines, make_task, posttrain, sft_experiment

pytestmark = pytest.mark.slow
CONFIGS = Path(__file__).parents[1] / "configs"
STEPS = 40
SHORT = {
    "megatron": (f"train_iters={STEPS}", f"eval_interval={STEPS}", "log_interval=20",
                 "save_interval=100000"),
    "torchtitan": (f"training.steps={STEPS}", f"validator.freq={STEPS}", "metrics.log_freq=20",
                   "checkpoint.enable=false"),
    "maxtext": (f"steps={STEPS}", f"eval_interval={STEPS}", "log_period=20"),
}  # fmt: skip


def eval_losses(tmp_path: Path, backends: list[str], *overrides: str) -> dict[str, float]:
    """Each backend's eval loss after STEPS steps of the same fine-tune (run in this process:
    the frameworks are imported once)."""
    task = make_task(tmp_path / "task")
    evals = {}
    for backend in backends:
        exp = sft_experiment(CONFIGS / backend / "sft-tiny-cpu.yaml", tmp_path / backend, task)
        with in_process(sft_runs):
            run = posttrain(exp, *SHORT[backend], *overrides)
        evals[backend] = eval_lines(run)[STEPS]["eval_loss"]
    return evals


def test_megatron_and_torchtitan_fine_tune_alike(tmp_path: Path) -> None:
    evals = eval_losses(tmp_path, ["megatron", "torchtitan"])
    assert evals["torchtitan"] == pytest.approx(evals["megatron"], rel=0.02), evals


def test_megatron_torchtitan_and_maxtext_lora_fine_tune_alike(tmp_path: Path) -> None:
    evals = eval_losses(tmp_path, list(SHORT), "peft.type=lora")
    assert evals["megatron"] < 5.0, evals  # from 5.89: the adapters learned
    for backend in ("torchtitan", "maxtext"):
        assert evals[backend] == pytest.approx(evals["megatron"], rel=0.02), evals
