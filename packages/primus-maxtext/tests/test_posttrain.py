"""`primus train posttrain` through MaxText's own training loop on CPU: a tiny Llama-3 HF model
(with its tokenizer) fine-tuned on the reverse-words task from its import, exported, resumed;
the batches MaxText reads against the tokenizer's chat template; `peft:` refused; the GPU
recipe against the published Llama-3.2-1B config."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from primus.testing import sft_runs
from primus.testing.runs import primus, step_metrics

pytestmark = pytest.mark.slow
RECIPE = Path(__file__).parents[3] / "configs" / "maxtext" / "sft-tiny-cpu.yaml"
STEPS = 600  # the recipe's
RESUME_FROM = 500  # a checkpoint of the recipe (MaxText's step 500: 501 updates done)


@pytest.fixture(scope="module")
def task(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return sft_runs.make_task(tmp_path_factory.mktemp("task"))


def experiment(folder: Path, task: dict[str, Path], **changes: Any) -> Path:
    return sft_runs.sft_experiment(RECIPE, folder, task, **changes)


@pytest.fixture(scope="module")
def finetuned(tmp_path_factory: pytest.TempPathFactory, task: dict[str, Path]) -> Path:
    """The recipe's full fine-tune from the HF import, run as shipped: the run directory."""
    return sft_runs.shipped_run(RECIPE, tmp_path_factory.mktemp("sft") / "sft", task)


def test_the_batches_maxtext_reads_train_on_the_assistant_tokens(
    task: dict[str, Path], tmp_path: Path
) -> None:
    """A global batch as MaxText's loader gets it: per row, the targets in the loss
    (targets_segmentation != 0) are the assistant's answer and <|eot_id|>, as the tokenizer's
    own chat template writes them; each of two processes loads its half of the batch."""
    from primus.backends.maxtext.posttrain.sft import TrainRows
    from primus.core.posttrain import build_sft_data

    data = build_sft_data(sft_runs.module_of(experiment(tmp_path, task)).sft)
    rows = TrainRows(data.train, 8, 0, 1)
    rows.start = 0
    batch = next(iter(rows))
    for position in range(8):
        full, answer = sft_runs.template_tokens(task, data.train, position)
        trained = batch["targets"][position][batch["targets_segmentation"][position] != 0]
        assert trained.tolist() == answer
        assert batch["inputs"][position][: len(full) - 1].tolist() == full[:-1]
        assert batch["inputs_position"][position][: len(full) - 1].tolist() == list(
            range(len(full) - 1)
        )
        assert set(batch["inputs_segmentation"][position][len(full) - 1 :]) <= {0}
    halves = [TrainRows(data.train, 8, p, 2) for p in (0, 1)]
    for half in halves:
        half.start = 0
    both = [next(iter(half)) for half in halves]
    for key, value in batch.items():
        assert np.array_equal(np.concatenate([b[key] for b in both]), value), key


def test_finetuning_learns_the_reverse_task(finetuned: Path) -> None:
    evals = sft_runs.eval_lines(finetuned)
    last = evals[STEPS]
    assert last["eval_token_accuracy"] >= 0.95, evals
    assert last["eval_loss"] < evals[min(evals)]["eval_loss"]
    log = (finetuned / "logs" / "rank-0.log").read_text()
    assert f"step {STEPS}/{STEPS} | loss" in log and "| eval token acc " in log
    assert "restoring params from" in log and "hf_import" in log
    assert all(m["eval_loss"] is None for m in step_metrics(finetuned) if m["step"] not in evals)


def test_the_export_evaluates_as_the_run_did(
    finetuned: Path, task: dict[str, Path], tmp_path: Path
) -> None:
    """`primus checkpoint export` after fine-tuning: transformers' eval of the HF model equals
    the run's last eval; the tokenizer comes along."""
    sft_runs.assert_export_evaluates_as_run(finetuned, tmp_path / "hf", STEPS)


def test_resume_continues_exactly(finetuned: Path, task: dict[str, Path], tmp_path: Path) -> None:
    """A new run directory holding only the HF import and the fine-tune's checkpoint at
    MaxText step 500 logs the fine-tune's losses and evals from there on (its rows by
    position from the checkpoint's step)."""
    exp = experiment(tmp_path / "resumed", task)
    resumed_run = sft_runs.resumed(finetuned, exp, ["hf_import", f"checkpoints/{RESUME_FROM}"])
    sft_runs.posttrain(exp)
    sft_runs.assert_continues(finetuned, resumed_run, RESUME_FROM + 1)


def test_two_data_parallel_processes_train_as_one(
    finetuned: Path, task: dict[str, Path], tmp_path: Path
) -> None:
    """Two processes (one CPU device each), each loading its half of every global batch, the
    schedule of the whole run: the first steps' losses are the one-process run's; after 100
    steps the float32 sums, reduced in another order across processes, have drifted by less
    than 1e-3 (losses and eval loss; accuracy within one token of the 411)."""
    exp = experiment(tmp_path / "dp2", task)
    shutil.copytree(finetuned / "hf_import", sft_runs.run_dir(exp) / "hf_import")
    run = sft_runs.posttrain(exp, "--nproc-per-node", "2", "per_device_batch_size=16",
                             "steps=100", f"learning_rate_schedule_steps={STEPS}",
                             "enable_checkpointing=false")  # fmt: skip
    whole = {m["step"]: m for m in step_metrics(finetuned)}
    two = {m["step"]: m for m in step_metrics(run)}
    assert sorted(two) == list(range(1, 101))
    for step, metrics in two.items():
        close = 1e-5 if step <= 10 else 1e-3
        assert metrics["loss"] == pytest.approx(whole[step]["loss"], rel=close), step
    assert two[100]["eval_loss"] == pytest.approx(whole[100]["eval_loss"], rel=1e-3)
    assert two[100]["eval_token_accuracy"] == pytest.approx(
        whole[100]["eval_token_accuracy"], abs=0.003
    )


def test_packed_rows_attend_within_their_sample(task: dict[str, Path], tmp_path: Path) -> None:
    """Packing on, learning rate 0: MaxText's eval of the packed rows (several samples each,
    kept apart by their segment ids) equals transformers' eval of the HF model over the same
    samples one per row."""
    from primus.testing.sft_data import hf_eval_stats

    exp = experiment(tmp_path / "packed", task, packing=True, seq_length=96)
    run = sft_runs.posttrain(exp, "steps=2", "eval_interval=1", "learning_rate=0",
                             "enable_checkpointing=false")  # fmt: skip
    packed = sft_runs.eval_rows(exp)
    assert packed.num_samples > 2 * len(packed)  # several samples a row
    unpacked = sft_runs.eval_rows(experiment(tmp_path / "unpacked", task))
    stats = hf_eval_stats(task["hf"], unpacked)
    metrics = sft_runs.eval_lines(run)[1]
    assert metrics["eval_loss"] == pytest.approx(stats.loss, rel=1e-4)
    assert metrics["eval_token_accuracy"] == pytest.approx(stats.accuracy, abs=1e-6)


@pytest.mark.parametrize(
    ("section", "capability", "line_of"), [("peft", "lora", "type: lora"), ("dpo", "dpo", "dpo:")]
)
def test_lora_and_dpo_are_refused(
    task: dict[str, Path], tmp_path: Path, section: str, capability: str, line_of: str
) -> None:
    """MaxText declares neither the lora capability (its LoRA lives in its Tunix trainer only)
    nor dpo: each section is one error at its line, naming the backends that have it."""
    exp = experiment(tmp_path / section, task, peft={"type": "lora", "rank": 4})
    if section == "dpo":  # preference training instead: no peft, no eval
        from primus.testing.dpo import write_preference_task

        written = yaml.safe_load(exp.read_text())
        module = written["modules"]["post_trainer"]
        del module["peft"]
        module["sft"]["eval"] = None  # the recipe's eval file: none
        module["sft"]["train"] = str(write_preference_task(tmp_path / "pairs", 4)["train"])
        exp.write_text(
            yaml.safe_dump(written | {"modules": {"post_trainer": module | {"dpo": {"beta": 0.1}}}})
        )
    done = primus("train", "posttrain", "--config", str(exp), "--dry-run")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert f"the maxtext backend does not provide {capability}" in done.stderr
    assert "backends that do: megatron, torchtitan" in done.stderr
    line = next(n for n, text in enumerate(exp.read_text().splitlines(), 1) if line_of in text)
    assert f"error: {exp}:{line}:" in done.stderr


def test_the_gpu_recipe_builds_against_the_published_model(
    task: dict[str, Path], tmp_path: Path
) -> None:
    """llama3.2_1B-sft.yaml with Llama-3.2-1B's published config.json (no weights: a dry run)
    passes the architecture check and MaxText's config validation, packing on."""
    hf, stdout = sft_runs.published_dry_run(
        RECIPE.with_name("llama3.2_1B-sft.yaml"), task, tmp_path
    )
    assert "MaxTextPosttrainTrainer" in stdout
    for arg in (  # MaxText's command line
        "max_target_length=4096",
        "dataset_type=synthetic",
        "hardware=gpu",
        "dtype=bfloat16",
        "attention=autoselected",
        f"tokenizer_path={hf}",
        "tokenizer_type=huggingface",
        "eval_start_step=49",
    ):
        assert f"\n- {arg}\n" in stdout, arg
