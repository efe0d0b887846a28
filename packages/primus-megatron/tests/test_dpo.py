"""`primus train posttrain` with `dpo:` through megatron.training on CPU: the tiny Llama-3 HF
model on the reverse task's preference pairs, each checked step against transformers' float64
DPO loss and rewards of the same pairs (`hf_dpo_loss`). Full DPO: the reference is the HF
model the run started from; LoRA DPO: the base without its adapters. The refusals, from the
config alone. Runs and exports of one process run in the test process
(`primus.testing.in_process`)."""

from __future__ import annotations

import math
import signal
from pathlib import Path
from typing import Any

import pytest

from primus.core.posttrain import REWARD_METRICS, build_pair_data
from primus.core.reliability import preemption
from primus.testing import sft_runs
from primus.testing.dpo import assert_reference_pass_stopped, hf_dpo_loss, write_preference_task
from primus.testing.in_process import in_process, primus_here
from primus.testing.runs import step_metrics
from primus.testing.sft_runs import make_task, module_of, posttrain, sft_experiment

pytestmark = pytest.mark.slow
RECIPE = Path(__file__).parents[3] / "configs" / "megatron" / "dpo-tiny-cpu.yaml"
BATCH = 8  # pairs a step
STEPS = (f"global_batch_size={BATCH}", "log_interval=1")
LORA = {"type": "lora", "rank": 4, "alpha": 8.0, "dropout": 0.0,
        "target_modules": ["q_proj", "v_proj", "down_proj"]}  # fmt: skip


@pytest.fixture(scope="module")
def task(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The tiny HF model (`hf`) and 64 reverse-task preference pairs (`pairs`)."""
    root = tmp_path_factory.mktemp("task")
    return make_task(root) | {"pairs": write_preference_task(root / "data", 64)["train"]}


def experiment(
    folder: Path, task: dict[str, Path], peft: dict[str, Any] | None = None,
    adapter: Path | None = None, **sft: Any,
) -> Path:  # fmt: skip
    """The recipe on `task`'s pairs (no eval unless `sft` holds one), from its HF model."""
    return sft_experiment(
        RECIPE, folder, task, peft, adapter, train=str(task["pairs"]), eval=None, **sft
    )


def assert_step_is(metrics: dict[str, Any], expected: dict[str, float]) -> None:
    """A metrics.jsonl record's loss and rewards are `hf_dpo_loss`'s (float32 against 64)."""
    for key in ("loss", *REWARD_METRICS):
        assert metrics[key] == pytest.approx(expected[key], rel=1e-5, abs=1e-6), key


@pytest.fixture(scope="module")
def full_run(tmp_path_factory: pytest.TempPathFactory, task: dict[str, Path]) -> Path:
    """Full DPO, 3 steps of 2 micro-batches, the first at learning rate 0 (warm-up from 0),
    a checkpoint after step 2, 6 of the 64 pairs held out and evaluated after step 2 (the
    second eval micro-batch half padding), the reference's log-probabilities precomputed
    (LoRA DPO's test runs the reference in every step): the run directory (the metrics of
    steps 2 and 3: the first step of a run is not timed)."""
    exp = experiment(tmp_path_factory.mktemp("dpo") / "dpo", task, eval_fraction=0.1)
    with in_process(sft_runs):
        return posttrain(exp, *STEPS, "micro_batch_size=4", "train_iters=3", "save_interval=2",
                         "eval_interval=2", "lr_warmup_iters=1", "lr=1e-2", "min_lr=1e-2",
                         "dpo.precompute_reference=true")  # fmt: skip


@pytest.fixture(scope="module")
def step2(full_run: Path) -> Path:
    """The full DPO run's step-2 checkpoint exported as an HF model."""
    exp = full_run.parents[3] / "exp.yaml"
    hf = exp.parent / "step2"
    with in_process():
        done = primus_here("checkpoint", "export", "--config", str(exp), "--hf", str(hf),
                           "--iteration", "2")  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return hf


def test_full_dpo_steps_as_transformers_computes_them(
    full_run: Path, step2: Path, task: dict[str, Path]
) -> None:
    """Step 2: the policy is still the initial weights, the reference: loss log 2, no reward.
    Step 3's loss and rewards, the means over its pairs and micro-batches, are transformers'
    with step 2's checkpoint as the policy and the HF model as the reference."""
    second, third = step_metrics(full_run)
    assert second["loss"] == pytest.approx(math.log(2), abs=1e-6)
    assert [second[key] for key in REWARD_METRICS] == [0, 0, 0, 0]
    exp, hf = full_run.parents[3] / "exp.yaml", step2
    module = module_of(exp)
    pairs = build_pair_data(module.sft).train.batch(2 * BATCH, BATCH)  # the pairs of step 3
    expected = hf_dpo_loss(hf, task["hf"], pairs, module.dpo.beta)
    assert abs(expected["loss"] - math.log(2)) > 1e-3  # step 2 moved the policy
    assert_step_is(third, expected)


def test_full_dpo_evaluates_every_held_out_pair_as_transformers_does(
    full_run: Path, step2: Path, task: dict[str, Path]
) -> None:
    """The eval after step 2 (eval_interval 2) is on step 2's line and in metrics.jsonl: the
    DPO loss and rewards of the 6 held-out pairs, each once, under step 2's weights against
    the HF model; step 3 did not evaluate."""
    second, third = step_metrics(full_run)
    assert third["eval_loss"] is None and third["eval_reward_accuracy"] is None
    exp = full_run.parents[3] / "exp.yaml"
    module = module_of(exp)
    held = build_pair_data(module.sft).eval
    assert held is not None and len(held) == 6
    expected = hf_dpo_loss(step2, task["hf"], held.batch(0, len(held)), module.dpo.beta)
    assert abs(expected["loss"] - math.log(2)) > 1e-3  # step 2 moved the policy
    assert second["eval_loss"] == pytest.approx(expected["loss"], rel=1e-5)
    for key in REWARD_METRICS:
        assert second[f"eval_{key}"] == pytest.approx(expected[key], rel=1e-5, abs=1e-6), key
    log = (full_run / "logs" / "rank-0.log").read_text()
    assert "step 2/3 | loss 0.6931 | eval loss " in log and " | eval reward acc " in log
    assert "the reference's log-probabilities of 64 pairs, precomputed in " in log


def test_full_dpo_with_tensor_parallel_logs_the_one_process_run(
    full_run: Path, task: dict[str, Path], tmp_path: Path
) -> None:
    """Two processes at tensor parallel 2 (gloo): both run the reference over every pair
    before the first step, rank 0 reads each micro-batch's precomputed log-probabilities and
    sends them to rank 1; every step's loss, rewards and eval are the one-process run's."""
    exp = experiment(tmp_path / "tp2", task, eval_fraction=0.1)
    run = posttrain(exp, "--nproc-per-node", "2", "tensor_model_parallel_size=2", *STEPS,
                    "micro_batch_size=4", "train_iters=3", "save_interval=2", "eval_interval=2",
                    "lr_warmup_iters=1", "lr=1e-2", "min_lr=1e-2",
                    "dpo.precompute_reference=true")  # fmt: skip
    ours, theirs = step_metrics(run), step_metrics(full_run)
    assert [m["step"] for m in ours] == [m["step"] for m in theirs] == [2, 3]
    keys = ("loss", *REWARD_METRICS, "eval_loss", *(f"eval_{k}" for k in REWARD_METRICS))
    for two, one in zip(ours, theirs, strict=True):
        for key in keys:  # step 3 has no eval: None in both
            expected = one[key] if one[key] is None else pytest.approx(one[key], rel=1e-5, abs=1e-6)
            assert two[key] == expected, (two["step"], key)
    assert ours[0]["eval_loss"] is not None


def test_lora_dpo_refers_to_the_base_without_adapters(
    task: dict[str, Path], tmp_path: Path
) -> None:
    """LoRA DPO from a nonzero PEFT adapter, at learning rate 0: step 2's loss and rewards are
    transformers' with the adapter merged as the policy and the bare HF model as the
    reference."""
    import torch
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(task["hf"], dtype=torch.float32)
    config = LoraConfig(r=LORA["rank"], lora_alpha=LORA["alpha"], lora_dropout=0.0,
                        target_modules=LORA["target_modules"], init_lora_weights=False)  # fmt: skip
    torch.manual_seed(0)
    get_peft_model(base, config).save_pretrained(tmp_path / "adapter")
    base = AutoModelForCausalLM.from_pretrained(task["hf"], dtype=torch.float32)
    merged = PeftModel.from_pretrained(base, tmp_path / "adapter").merge_and_unload()
    merged.save_pretrained(tmp_path / "merged")
    exp = experiment(tmp_path / "lora", task, LORA, tmp_path / "adapter")
    with in_process(sft_runs):
        run = posttrain(exp, *STEPS, "micro_batch_size=8", "train_iters=2", "save_interval=2",
                        "lr=0", "min_lr=0", "lr_warmup_iters=0")  # fmt: skip
    (second,) = step_metrics(run)
    module = module_of(exp)
    pairs = build_pair_data(module.sft).train.batch(BATCH, BATCH)  # the pairs of step 2
    expected = hf_dpo_loss(tmp_path / "merged", task["hf"], pairs, module.dpo.beta)
    assert abs(expected["loss"] - math.log(2)) > 1e-2  # the adapter moved the policy
    assert_step_is(second, expected)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("pipeline_model_parallel_size=2", "dpo is not supported with pipeline_model_parallel_size: 2"),
        ("context_parallel_size=2", "dpo is not supported with context_parallel_size: 2"),
        ("num_experts=4", "dpo is not supported with num_experts: 4"),
        ("mtp_num_layers=1", "dpo is not supported with mtp_num_layers: 1"),
    ],
)  # fmt: skip
def test_what_dpo_does_not_cover_is_refused(
    task: dict[str, Path], tmp_path: Path, override: str, message: str
) -> None:
    assert message in refusal(experiment(tmp_path, task), override)


def test_dpo_without_initial_weights_is_refused(task: dict[str, Path], tmp_path: Path) -> None:
    exp = tmp_path / "scratch.yaml"
    exp.write_text(
        f"extends: {RECIPE}\nmodules:\n  post_trainer:\n    init_from: null\n"
        f"    sft: {{train: {task['pairs']}, tokenizer: {task['hf']}}}\n"
    )
    assert "dpo needs the run's initial weights as its reference" in refusal(exp)


def refusal(exp: Path, *overrides: str) -> str:
    """The ConfigError Megatron's config checks give `exp`'s module (no training)."""
    from primus.backends.megatron.megatron_adapter import MegatronAdapter
    from primus.core.errors import ConfigError
    from primus.core.runtime import resolution

    (module,) = resolution.load(exp, list(overrides), None, single=True).modules.values()
    with pytest.raises(ConfigError) as refused:
        MegatronAdapter("megatron").check_params(module, "posttrain")
    return str(refused.value)


def test_a_stop_signal_ends_the_reference_pass_before_the_first_step(
    task: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A SIGTERM during the reference's pass over the pairs (here: noted in its first
    micro-batch's forward) stops the pass at its next micro-batch, not after the whole pass:
    exit 75 before the first step, nothing saved, the run dir marked for a requeue."""
    from primus.backends.megatron.posttrain import reference

    forward = reference.reference_losses

    def signalled(*args: Any, **kwargs: Any) -> Any:
        preemption.note(signal.SIGTERM)
        return forward(*args, **kwargs)

    monkeypatch.setattr(preemption, "_received", None)  # the test process's state, put back
    monkeypatch.setattr(reference, "reference_losses", signalled)
    exp = experiment(tmp_path / "stopped", task)
    with in_process():  # the run's environment (the signal noted there) is put back after it
        done = primus_here("train", "posttrain", "--config", str(exp), *STEPS,
                           "micro_batch_size=4", "train_iters=2", "lr_warmup_iters=1",
                           "dpo.precompute_reference=true", cwd=tmp_path)  # fmt: skip
    assert_reference_pass_stopped(done, exp)
