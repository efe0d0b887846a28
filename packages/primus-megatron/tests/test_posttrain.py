"""`primus train posttrain` through megatron.training on CPU: a tiny Llama-3 HF model (with its
tokenizer) fine-tuned on the reverse-words task from its import, resumed, exported; the rows
Megatron reads against the tokenizer's chat template; a packed eval against transformers.
LoRA: only the adapters train and are checkpointed, the frozen weights stay the HF import's,
and the merged export gives the adapted model's logits and eval. Runs, exports, the dry run and
the forward script of one process run in the test process (`primus.testing.in_process`);
several ranks in subprocesses."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from primus.testing import sft_runs
from primus.testing.in_process import in_process
from primus.testing.runs import step_metrics
from primus.testing.scripts import run_script_here, script
from primus.testing.sft_runs import (
    assert_adapter_is_the_merged_export,
    assert_adapters_learned,
    assert_continues,
    assert_evaluates_as,
    assert_export_evaluates_as_run,
    assert_learned,
    assert_merged_only,
    assert_run_keeps_its_adapter,
    eval_lines,
    eval_rows,
    export,
    make_task,
    module_of,
    posttrain,
    published_dry_run,
    resumed,
    safetensors,
    sft_experiment,
    shipped_run,
)

pytestmark = pytest.mark.slow
RECIPE = Path(__file__).parents[3] / "configs" / "megatron" / "sft-tiny-cpu.yaml"
FORWARD = Path(__file__).with_name("megatron_forward.py")
STEPS = 600  # the recipe's


@pytest.fixture(scope="module")
def task(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_task(tmp_path_factory.mktemp("task"))


def experiment(
    folder: Path,
    task: dict[str, Path],
    peft: dict[str, Any] | None = None,
    adapter: Path | None = None,
    **sft: Any,
) -> Path:
    return sft_experiment(RECIPE, folder, task, peft, adapter, **sft)


@pytest.fixture(scope="module")
def finetuned(tmp_path_factory: pytest.TempPathFactory, task: dict[str, Path]) -> Path:
    """The recipe's full fine-tune from the HF import, run as shipped: the run directory."""
    with in_process(sft_runs):
        return shipped_run(RECIPE, tmp_path_factory.mktemp("sft") / "sft", task)


def test_the_rows_megatron_reads_train_on_the_assistant_tokens(
    task: dict[str, Path], tmp_path: Path
) -> None:
    """A micro-batch as Megatron's data loader stacks it: per row, the loss mask is the
    core row's, and the targets it covers are the assistant's answer and <|eot_id|>, as the
    tokenizer's own chat template writes them."""

    from transformers import AutoTokenizer

    from primus.backends.megatron.posttrain.sft import SFTSamples
    from primus.core.posttrain import build_sft_data

    data = build_sft_data(module_of(experiment(tmp_path, task)).sft)
    batch = next(iter(torch.utils.data.DataLoader(SFTSamples(data.train, 8, False, True), 8)))
    records = [json.loads(line) for line in task["chat_train"].read_text().splitlines()]
    tokenizer = AutoTokenizer.from_pretrained(task["hf"])
    for position in range(8):
        row = data.train.row(position)
        assert torch.equal(batch["loss_mask"][position], torch.as_tensor(row["loss_mask"]))
        (sample,) = data.train.rows[data.train.order(0)[position]]
        messages = records[sample]["messages"]
        text = tokenizer.apply_chat_template(messages, tokenize=False)
        full = tokenizer(text, add_special_tokens=False)["input_ids"]
        answer = tokenizer(messages[-1]["content"], add_special_tokens=False)["input_ids"]
        trained = batch["labels"][position][batch["loss_mask"][position] == 1].tolist()
        assert trained == [*answer, tokenizer.convert_tokens_to_ids("<|eot_id|>")]
        assert batch["tokens"][position][: len(full) - 1].tolist() == full[:-1]


def test_finetuning_learns_the_reverse_task(finetuned: Path) -> None:
    assert_learned(finetuned, STEPS)
    assert "starting from the HF import" in (finetuned / "logs" / "rank-0.log").read_text()


def test_the_export_evaluates_as_the_run_did(finetuned: Path, tmp_path: Path) -> None:
    with in_process(sft_runs):
        assert_export_evaluates_as_run(finetuned, tmp_path / "hf", STEPS)


def assert_resumes_exactly(run: Path, exp: Path, step: int, *overrides: str) -> None:
    """`exp` run from `run`'s checkpoint at `step` (a new run directory holding only the HF
    import and that checkpoint) logs `run`'s losses and evals from there on."""
    checkpoints = resumed(run, exp, ["checkpoints/iter_0000000", f"checkpoints/iter_{step:07d}"])
    (checkpoints / "checkpoints" / "latest_checkpointed_iteration.txt").write_text(str(step))
    with in_process(sft_runs):
        assert_continues(run, posttrain(exp, *overrides), step)


def test_resume_continues_exactly(finetuned: Path, task: dict[str, Path], tmp_path: Path) -> None:
    assert_resumes_exactly(finetuned, experiment(tmp_path / "resumed", task), 500)


def test_two_data_parallel_ranks_train_as_one(
    finetuned: Path, task: dict[str, Path], tmp_path: Path
) -> None:
    """Two processes (gloo), each reading its half of every global batch: the same losses and
    eval as the one-process run (the loss is one masked mean over the global batch)."""
    exp = experiment(tmp_path / "dp2", task)
    run = posttrain(exp, "--nproc-per-node", "2", "micro_batch_size=16", "exit_interval=100")
    whole = {m["step"]: m for m in step_metrics(finetuned)}
    two = {m["step"]: m for m in step_metrics(run)}
    assert sorted(two) == [s for s in sorted(whole) if s <= 100]
    for step, metrics in two.items():
        assert metrics["loss"] == pytest.approx(whole[step]["loss"], rel=1e-4), step
    for key in ("eval_loss", "eval_token_accuracy"):
        assert two[100][key] == pytest.approx(whole[100][key], rel=1e-4), key


def test_packed_rows_attend_within_their_sample(task: dict[str, Path], tmp_path: Path) -> None:
    """Packing on, learning rate 0: the eval of the packed rows (several samples each) equals
    transformers' eval of the HF model over the same samples one per row."""

    exp = experiment(tmp_path / "packed", task, packing=True, seq_length=96)
    with in_process(sft_runs):
        run = posttrain(exp, "train_iters=4", "eval_interval=4", "log_interval=2", "lr=0",
                        "min_lr=0", "lr_warmup_iters=0", "save_interval=1000")  # fmt: skip
    packed = eval_rows(exp)
    assert packed.num_samples > len(packed)  # several samples a row
    assert_evaluates_as(task["hf"], experiment(tmp_path / "unpacked", task), eval_lines(run)[4])


# -- LoRA ----------------------------------------------------------------------------
LORA_STEPS = 60
TARGETS = ["q_proj", "v_proj", "o_proj", "up_proj", "down_proj"]  # not k_proj, gate_proj
LORA = {"type": "lora", "rank": 4, "alpha": 8.0, "target_modules": TARGETS}
TRAIN = (f"train_iters={LORA_STEPS}", "log_interval=10", "eval_interval=30", "save_interval=30")


def frozen(model: list[Any]) -> dict[str, torch.Tensor]:
    """The model's tensors but the LoRA adapters, copied."""
    from primus.backends.megatron.posttrain.lora import ADAPTER

    (chunk,) = model
    return {k: v.detach().clone() for k, v in chunk.state_dict().items()
            if ADAPTER not in k and not k.endswith("_extra_state")}  # fmt: skip


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory: pytest.TempPathFactory, task: dict[str, Path]) -> Path:
    """The LoRA fine-tune from the HF import, in the test process, with the model's frozen
    weights (`frozen`) as Megatron's setup_model_and_optimizer returns them and as training
    left them saved in `frozen.pt` beside the experiment: the run directory."""
    from megatron.training import training

    exp = experiment(tmp_path_factory.mktemp("lora") / "lora", task, peft=LORA)
    setup, kept = training.setup_model_and_optimizer, dict[str, Any]()

    def setup_and_keep(*args: Any, **kwargs: Any) -> Any:
        model, *rest = setup(*args, **kwargs)
        kept["model"], kept["before"] = model, frozen(model)
        return (model, *rest)

    with in_process(sft_runs), pytest.MonkeyPatch.context() as patch:
        patch.setattr(training, "setup_model_and_optimizer", setup_and_keep)
        run = posttrain(exp, *TRAIN)
    torch.save({"before": kept["before"], "after": frozen(kept["model"])},
               exp.with_name("frozen.pt"))  # fmt: skip
    return run


def test_the_frozen_weights_do_not_change_in_training(lora_run: Path) -> None:
    """Every weight of the trained model but the adapters holds, bit for bit, what it held when
    training started (the HF import's, loaded by add_lora)."""
    saved = torch.load(lora_run.parents[3] / "frozen.pt")
    before, after = saved["before"], saved["after"]
    assert sorted(before) == sorted(after) and len(before) >= 15, sorted(before)
    for key, tensor in before.items():
        assert torch.equal(after[key], tensor), key


@pytest.fixture(scope="module")
def exported(lora_run: Path) -> Path:
    """`primus checkpoint export` of the LoRA run: the HF directory (merged), and beside it
    the PEFT adapter (`adapter`)."""
    folder = lora_run.parents[3]
    with in_process(sft_runs):
        return export(folder / "exp.yaml", folder / "exported", folder / "adapter")


def test_only_the_adapters_train_and_are_checkpointed(lora_run: Path) -> None:
    import torch.distributed.checkpoint as dcp

    stored = dcp.FileSystemReader(str(lora_run / "checkpoints" / "iter_0000060")).read_metadata()
    tensors = [k for k, v in stored.state_dict_metadata.items() if hasattr(v, "size")]
    model = [k for k in tensors if not k.startswith("optimizer.")]
    assert sorted(model) == sorted(
        f"decoder.layers.{path}.lora.{side}.{name}.weight"
        for name, path in [("q_proj", "self_attention.linear_qkv"),
                           ("v_proj", "self_attention.linear_qkv"),
                           ("o_proj", "self_attention.linear_proj"),
                           ("up_proj", "mlp.linear_fc1"), ("down_proj", "mlp.linear_fc2")]
        for side in "ab"
    )  # fmt: skip
    optimizer = {k.split(".", 3)[-1] for k in tensors if k.startswith("optimizer.")}
    assert optimizer and all(".lora." in k for k in optimizer), optimizer
    assert "LoRA: rank 4, alpha 8 (scaling 2)" in (lora_run / "logs" / "rank-0.log").read_text()


def test_the_adapters_learn(lora_run: Path, task: dict[str, Path]) -> None:
    assert_adapters_learned(lora_run, task["hf"], LORA_STEPS)


def test_the_merged_export_keeps_the_frozen_weights(exported: Path, task: dict[str, Path]) -> None:
    assert_merged_only(task["hf"], exported, TARGETS)


def test_the_merged_export_gives_the_adapted_models_logits(
    lora_run: Path, exported: Path, tmp_path: Path
) -> None:
    """Megatron's forward of the adapted model (frozen weights from the import, adapters from
    the last checkpoint) against transformers' forward of the merged export, in fp32."""
    from primus.testing.hf_models import hf_logits

    tokens = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(0))
    torch.save(tokens, tmp_path / "tokens.pt")
    job = {"exp": str(lora_run.parents[3] / "exp.yaml"), "stage": "posttrain",
           "tokens": str(tmp_path / "tokens.pt"), "out": str(tmp_path / "megatron.pt"),
           "overrides": list(TRAIN)}  # fmt: skip
    (tmp_path / "jobs.json").write_text(json.dumps([job]))
    run_script_here(script(FORWARD), str(tmp_path / "jobs.json"))
    ours = torch.load(tmp_path / "megatron.pt", weights_only=False)["logits"]
    assert (ours - hf_logits(exported, tokens)).abs().max() <= 1e-4


def test_the_peft_adapter_gives_the_merged_exports_logits(
    exported: Path, task: dict[str, Path]
) -> None:
    """`checkpoint export --adapter`: peft loads it onto the HF model the run started from,
    with the logits of the merged export (fp32): each projection's adapter under its HF name."""
    assert_adapter_is_the_merged_export(task["hf"], exported.parent / "adapter", exported)


def test_a_run_continues_an_exported_peft_adapter(
    exported: Path, task: dict[str, Path], tmp_path: Path
) -> None:
    """`init_from: {hf, adapter}`: the adapters start from the PEFT adapter the LoRA run
    exported (learning rate 0: they end as they started)."""
    adapter = exported.parent / "adapter"
    exp = experiment(tmp_path / "continued", task, peft=LORA, adapter=adapter)
    with in_process(sft_runs):
        assert_run_keeps_its_adapter(
            exp,
            adapter,
            "train_iters=2",
            "save_interval=2",
            "eval_interval=100",
            "lr_warmup_iters=0",
            "lr=0",
            "min_lr=0",
        )


def test_the_merged_export_evaluates_as_the_run_did(lora_run: Path, exported: Path) -> None:
    """The run's last eval used the in-memory frozen weights: equal to transformers' eval of
    the import's weights with the adapters merged, so training left them as imported."""
    assert_evaluates_as(
        exported, lora_run.parents[3] / "exp.yaml", eval_lines(lora_run)[LORA_STEPS]
    )


def test_the_gpu_recipe_builds_against_the_published_model(
    task: dict[str, Path], tmp_path: Path
) -> None:
    """llama3.2_1B-sft.yaml with Llama-3.2-1B's published config.json (no weights: a dry run)
    passes the architecture check and Megatron's validate_args, packing on."""
    recipe = RECIPE.with_name("llama3.2_1B-sft.yaml")
    with in_process(sft_runs):
        hf, stdout = published_dry_run(recipe, task, tmp_path)
    assert "MegatronPosttrainTrainer" in stdout
    for line in (
        "seq_length: 4096",
        "create_attention_mask_in_dataloader: true",
        "calculate_per_token_loss: true",
        "bf16: true",
        f"tokenizer_model: {hf}",
    ):
        assert f"\n{line}\n" in stdout, line  # fmt: skip


def test_lora_resumes_exactly(lora_run: Path, task: dict[str, Path], tmp_path: Path) -> None:
    """Resumed from its adapters-only checkpoint at step 30 (the frozen weights from the HF
    import, the adapters and their optimizer state from the checkpoint)."""
    exp = experiment(tmp_path / "lora_resumed", task, peft=LORA)
    assert_resumes_exactly(lora_run, exp, 30, *TRAIN)
    # the same checkpoint with other targets: one error, not DCP's KeyError traceback
    other = experiment(tmp_path / "lora_other", task, peft=LORA | {"target_modules": ["gate_proj"]})
    copy = resumed(lora_run, other, ["checkpoints/iter_0000000", "checkpoints/iter_0000030"])
    (copy / "checkpoints" / "latest_checkpointed_iteration.txt").write_text("30")
    with in_process(sft_runs):
        done = sft_runs.primus("train", "posttrain", "--config", str(other), *TRAIN)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "iter_0000030 holds no decoder." in done.stderr and "other LoRA targets" in done.stderr
    # the finished run run again: nothing left to train, exit 0, and it says so; with a
    # save_interval that does not divide 60 (Megatron would write iteration 60 again), before
    # the model is built
    again = experiment(tmp_path / "lora_again", task, peft=LORA)
    copy = resumed(lora_run, again, ["checkpoints/iter_0000000", "checkpoints/iter_0000060"])
    (copy / "checkpoints" / "latest_checkpointed_iteration.txt").write_text("60")
    finished = "already finished at step 60: nothing was trained (raise train_iters above 60"
    with in_process(sft_runs):
        log = (posttrain(again, *TRAIN) / "logs" / "rank-0.log").read_text()
    assert "iter_0000060 (iteration 60)" in log and "posttrain finished" in log
    assert finished in log
    final = copy / "checkpoints" / "iter_0000060"
    written = {path: path.stat().st_mtime_ns for path in final.iterdir()}
    with in_process(sft_runs):
        run = posttrain(again, *TRAIN[:-1], "save_interval=40")
    log = (run / "logs" / "rank-0.log").read_text()
    assert f"checkpoint in {copy / 'checkpoints'} is at iteration 60" in log
    assert log.count(finished) == 2 and log.count("resumed from") == 1  # no model the 2nd time
    assert {path: path.stat().st_mtime_ns for path in final.iterdir()} == written


def test_lora_with_tensor_parallel_trains_as_one_process(
    lora_run: Path, exported: Path, task: dict[str, Path], tmp_path: Path
) -> None:
    """Two processes at tensor parallel 2 (gloo; column-parallel linears: B sharded by output
    rows, row-parallel: A by input columns) log the one-process LoRA run's losses and evals,
    and their checkpoint (whole A and B) exports as that run's: merged and PEFT adapter."""
    from megatron.core.dist_checkpointing.serialization import load_common_state_dict

    exp = experiment(tmp_path / "tp2", task, peft=LORA)
    run = posttrain(exp, "--nproc-per-node", "2", "tensor_model_parallel_size=2", *TRAIN)
    saved = load_common_state_dict(str(run / "checkpoints" / f"iter_{LORA_STEPS:07d}"))["args"]
    assert saved.tensor_model_parallel_size == 2
    assert_continues(lora_run, run, 0)
    with in_process(sft_runs):
        ours = export(exp, tmp_path / "hf", tmp_path / "adapter")
    for folder, theirs in (
        (ours, exported),
        (ours.with_name("adapter"), exported.with_name("adapter")),
    ):
        two, one = safetensors(folder), safetensors(theirs)
        assert sorted(two) == sorted(one)
        assert all((two[k] - one[k]).abs().max() <= 1e-5 for k in one), folder


@pytest.mark.parametrize(
    "overrides",
    [["pipeline_model_parallel_size=3", "num_layers=3"],
     ["pipeline_model_parallel_size=2", "num_layers_per_virtual_pipeline_stage=1"]],
    ids=["three-stages", "virtual-stages"],
)  # fmt: skip
def test_packing_with_stages_that_read_no_rows_is_refused(
    task: dict[str, Path], tmp_path: Path, overrides: list[str]
) -> None:
    """Megatron hands the stages between the first and the last no batch, so no mask: their
    attention would run causal across the samples of a packed row. Refused at sft.packing."""
    from primus.backends.megatron.megatron_adapter import MegatronAdapter
    from primus.core.errors import ConfigError
    from primus.core.runtime import resolution

    exp = experiment(tmp_path / "pp", task, packing=True)
    (module,) = resolution.load(exp, overrides, None, single=True).modules.values()
    with pytest.raises(ConfigError) as refused:
        MegatronAdapter("megatron").check_params(module, "posttrain")
    said = str(refused.value)
    assert "sft.packing with pipeline stages between the first and the last" in said, said
    assert "hint: set pipeline_model_parallel_size to 2 at most" in said
    (module,) = resolution.load(
        exp, [*overrides, "sft.packing=false"], None, single=True
    ).modules.values()
    MegatronAdapter("megatron").check_params(module, "posttrain")  # unpacked rows need no mask


def test_lora_with_sequence_parallel_is_refused(task: dict[str, Path], tmp_path: Path) -> None:
    """From the config alone, at the peft section's line."""
    from primus.backends.megatron.megatron_adapter import MegatronAdapter
    from primus.core.errors import ConfigError
    from primus.core.runtime import resolution

    exp = experiment(tmp_path / "sp", task, peft=LORA)
    overrides = ["tensor_model_parallel_size=2", "sequence_parallel=true"]
    (module,) = resolution.load(exp, overrides, None, single=True).modules.values()
    with pytest.raises(ConfigError) as refused:
        MegatronAdapter("megatron").check_params(module, "posttrain")
    assert "LoRA is not supported with sequence_parallel: True" in str(refused.value)
    assert f"{exp}:" in str(refused.value)
