"""`primus train posttrain` with `dpo:` through TorchTitan's Trainer on CPU (fp32): a tiny
Llama-3 HF model on the reverse task's preference pairs, its logged loss and rewards against
transformers' float64 DPO loss (`hf_dpo_loss`) of the same pairs. Full DPO (the reference: the
HF import, frozen, also after a resume) and LoRA DPO (the reference: the base, adapters off).
The runs go in the test process (TorchTitan imported once)."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from primus.core.reliability import preemption
from primus.testing import sft_runs
from primus.testing.dpo import assert_reference_pass_stopped, hf_dpo_loss, write_preference_task
from primus.testing.in_process import in_process, primus_here
from primus.testing.runs import step_metrics
from primus.testing.sft_runs import export, make_task, module_of, posttrain

pytestmark = pytest.mark.slow
RECIPE = Path(__file__).parents[3] / "configs" / "torchtitan" / "dpo-tiny-cpu.yaml"
BETA = 0.5
PAIRS = 8  # the global batch: two micro-batches of 4 pairs
BATCH = ("training.local_batch_size=4", f"training.global_batch_size={PAIRS}",
         "metrics.log_freq=1", "optimizer.lr=1e-2", "lr_scheduler.warmup_steps=0")  # fmt: skip
METRICS = ("loss", "reward_chosen", "reward_rejected", "reward_margin", "reward_accuracy")


@pytest.fixture(scope="module")
def task(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The tiny HF model (random weights), 64 preference pairs of the reverse task and 6 eval
    pairs (`eval`)."""
    root = tmp_path_factory.mktemp("task")
    files = write_preference_task(root / "data", 64, n_eval=6)
    return {**make_task(root), "pairs": files["train"], "eval": files["eval"]}


def experiment(folder: Path, task: dict[str, Path], **module: Any) -> Path:
    """The recipe on `task`'s model and pairs (beta BETA), its workspace in `folder`;
    `module`'s keys replace the module's (None: the recipe's)."""
    folder.mkdir(parents=True, exist_ok=True)
    keys = {"init_from": {"hf": str(task["hf"])}, "sft": {"train": str(task["pairs"])},
            "dpo": {"beta": BETA}, **module}  # fmt: skip
    keys = {k: v for k, v in keys.items() if v is not None}
    exp = folder / "exp.yaml"
    exp.write_text(yaml.safe_dump({"extends": str(RECIPE), "exp_name": folder.name,
                                   "workspace": str(folder / "ws"),
                                   "modules": {"post_trainer": keys}}))  # fmt: skip
    return exp


def logged(run: Path) -> dict[int, dict[str, Any]]:
    return {m["step"]: m for m in step_metrics(run)}


def pairs(exp: Path, step: int) -> Any:
    """The pairs of step `step` (counted from 1), as core's PairDataset gives them."""
    from primus.core.posttrain import build_pair_data

    return build_pair_data(module_of(exp).sft).train.batch((step - 1) * PAIRS, PAIRS)


def assert_logs_the_hf_loss(
    line: dict[str, Any], policy: Path, reference: Path, batch: Any
) -> None:
    """The logged loss to 1e-5 relative; each reward, a difference of two float32 sums of
    log-probs (tens each), to 1e-5."""
    expected = hf_dpo_loss(policy, reference, batch, BETA)
    assert line["loss"] == pytest.approx(expected["loss"], rel=1e-5)
    for name in METRICS[1:]:
        assert line[name] == pytest.approx(expected[name], abs=1e-5), name


@pytest.fixture(scope="module")
def full(tmp_path_factory: pytest.TempPathFactory, task: dict[str, Path]) -> dict[str, Path]:
    """Full DPO, evaluating `task`'s eval pairs after every step (two batches of 4 pairs, the
    second half padding), the reference's log-probabilities precomputed (LoRA DPO's test runs
    the reference in every step): one step (checkpointed), its export, then the run resumed
    for step 2."""
    folder = tmp_path_factory.mktemp("full")
    exp = experiment(folder, task, sft={"train": str(task["pairs"]), "eval": str(task["eval"])},
                     dpo={"beta": BETA, "precompute_reference": True})  # fmt: skip
    checkpoints = ("checkpoint.enable=true", "checkpoint.interval=1", "validator.freq=1")
    with in_process(sft_runs):
        posttrain(exp, *BATCH, *checkpoints, "training.steps=1")
        hf = export(exp, folder / "step-1")
        run = posttrain(exp, *BATCH, *checkpoints, "training.steps=2")
    return {"exp": exp, "run": run, "step-1": hf}


def test_full_dpo_starts_at_log_2(full: dict[str, Path]) -> None:
    """Step 1: the policy is the reference, every reward 0."""
    line = logged(full["run"])[1]
    assert line["loss"] == pytest.approx(math.log(2), abs=1e-6)
    assert line["reward_margin"] == line["reward_chosen"] == line["reward_rejected"] == 0


def test_full_dpo_after_a_resume_is_transformers_dpo_loss(
    full: dict[str, Path], task: dict[str, Path]
) -> None:
    """Step 2, resumed from step 1's checkpoint: the loss and rewards of step 2's pairs under
    step 1's weights (its export) against the initial HF model (the reference the resumed run
    still holds), over both micro-batches."""
    log = (full["run"] / "logs" / "rank-0.log").read_text()
    assert "the reference model holds the weights" in log
    assert "the reference's log-probabilities of 70 pairs, precomputed in " in log
    line = logged(full["run"])[2]
    assert abs(line["loss"] - math.log(2)) > 1e-3  # the policy has moved
    assert_logs_the_hf_loss(line, full["step-1"], task["hf"], pairs(full["exp"], 2))


def test_full_dpo_evaluates_every_eval_pair_as_transformers_does(
    full: dict[str, Path], task: dict[str, Path]
) -> None:
    """The eval after step 1 (on its line and in metrics.jsonl): the DPO loss and rewards of
    the 6 eval pairs, each once, under step 1's weights (its export) against the initial HF
    model; the resumed run evaluates after step 2."""
    from primus.core.posttrain import build_pair_data

    held = build_pair_data(module_of(full["exp"]).sft).eval
    assert held is not None and len(held) == 6
    expected = hf_dpo_loss(full["step-1"], task["hf"], held.batch(0, len(held)), BETA)
    first, second = logged(full["run"])[1], logged(full["run"])[2]
    assert abs(expected["loss"] - math.log(2)) > 1e-4  # step 1 moved the policy
    assert first["eval_loss"] == pytest.approx(expected["loss"], rel=1e-5)
    for name in METRICS[1:]:
        assert first[f"eval_{name}"] == pytest.approx(expected[name], abs=1e-5), name
    assert second["eval_loss"] is not None and second["eval_reward_accuracy"] is not None
    log = (full["run"] / "logs" / "rank-0.log").read_text()
    assert "step 1/1 | loss 0.6931 | eval loss " in log and " | eval reward acc " in log


TARGETS = ["o_proj", "up_proj", "down_proj"]
LORA = {"type": "lora", "rank": 4, "alpha": 8.0, "target_modules": TARGETS}


def nonzero_adapter(base: Path, folder: Path) -> tuple[Path, Path]:
    """A PEFT LoRA adapter of `base` with random A and B (peft's `init_lora_weights=False`),
    and `base` with it merged (an HF directory)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    config = LoraConfig(r=LORA["rank"], lora_alpha=LORA["alpha"], target_modules=TARGETS,
                        init_lora_weights=False)  # fmt: skip
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32), config)
    model.save_pretrained(folder / "adapter")
    model.merge_and_unload().save_pretrained(folder / "merged")
    return folder / "adapter", folder / "merged"


def test_lora_dpos_reference_is_the_base_without_its_adapters(
    task: dict[str, Path], tmp_path: Path
) -> None:
    """LoRA DPO from a nonzero adapter: step 1's loss and rewards are those of the base with
    the adapter merged (the policy) against the base (the reference), not log 2."""
    adapter, merged = nonzero_adapter(task["hf"], tmp_path)
    init = {"hf": str(task["hf"]), "adapter": str(adapter)}
    exp = experiment(tmp_path / "lora", task, peft=LORA, init_from=init)
    with in_process(sft_runs):
        run = posttrain(exp, *BATCH, "training.steps=1", "checkpoint.enable=false")
    assert "the reference is the base model" in (run / "logs" / "rank-0.log").read_text()
    line = logged(run)[1]
    assert abs(line["loss"] - math.log(2)) > 1e-3
    assert_logs_the_hf_loss(line, merged, task["hf"], pairs(exp, 1))


def test_dpo_without_an_hf_model_to_start_from_is_refused(
    task: dict[str, Path], tmp_path: Path
) -> None:
    """The recipe without its init_from (the tokenizer named instead): no model to hold as
    the reference."""
    recipe = yaml.safe_load(RECIPE.read_text())
    module = recipe["modules"]["post_trainer"]
    del module["init_from"]
    module["sft"].update(train=str(task["pairs"]), tokenizer=str(task["hf"]))
    exp = tmp_path / "exp.yaml"
    exp.write_text(yaml.safe_dump(recipe))
    with in_process():
        done = primus_here("train", "posttrain", "--config", str(exp), "--dry-run", cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "DPO's reference model is the run's initial weights" in done.stderr
    assert re.match(r"error: exp\.yaml:\d+: ", done.stderr)  # the file at fault, from the cwd


def test_a_stop_signal_ends_the_reference_pass_before_the_first_step(
    task: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A SIGTERM that came during set-up (here: before it, in the environment, as a launcher
    passes it on) stops the reference's pass over the pairs at its next batch, not after the
    whole pass: exit 75, nothing saved, the run dir marked for a requeue."""
    monkeypatch.setattr(preemption, "_received", None)  # the test process's state, put back
    monkeypatch.setenv(preemption.ENV, "SIGTERM")  # what watch() notes at the run's start
    exp = experiment(tmp_path / "stopped", task, dpo={"beta": BETA, "precompute_reference": True})
    with in_process():
        done = primus_here("train", "posttrain", "--config", str(exp), *BATCH,
                           "training.steps=2", cwd=tmp_path)  # fmt: skip
    assert_reference_pass_stopped(done, exp, "SIGTERM")
