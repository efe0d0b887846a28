"""`primus train posttrain` through MaxText's own training loop on CPU: a tiny Llama-3 HF model
(with its tokenizer) fine-tuned on the reverse-words task from its import, exported, resumed;
LoRA on it (one short run), exported merged and as a PEFT adapter; the batches MaxText reads
against the tokenizer's chat template; `dpo:` refused; the GPU recipe against the published
Llama-3.2-1B config."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from primus.testing import sft_runs
from primus.testing.faults import Forks
from primus.testing.forked import forked
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
def finetuned(
    tmp_path_factory: pytest.TempPathFactory, task: dict[str, Path], forks: Forks
) -> Path:
    """The recipe's full fine-tune from the HF import, run as shipped (a process forked by
    `forks`): the run directory."""
    with forked(forks, sft_runs):
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
    finetuned: Path, task: dict[str, Path], tmp_path: Path, forks: Forks
) -> None:
    """`primus checkpoint export` after fine-tuning (forked by `forks`): transformers' eval of
    the HF model equals the run's last eval; the tokenizer comes along."""
    with forked(forks, sft_runs):
        sft_runs.assert_export_evaluates_as_run(finetuned, tmp_path / "hf", STEPS)


def test_resume_continues_exactly(
    finetuned: Path, task: dict[str, Path], tmp_path: Path, forks: Forks
) -> None:
    """A new run directory holding only the HF import and the fine-tune's checkpoint at
    MaxText step 500 logs the fine-tune's losses and evals from there on (its rows by
    position from the checkpoint's step)."""
    exp = experiment(tmp_path / "resumed", task)
    resumed_run = sft_runs.resumed(finetuned, exp, ["hf_import", f"checkpoints/{RESUME_FROM}"])
    with forked(forks, sft_runs):
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


def test_packed_rows_attend_within_their_sample(
    task: dict[str, Path], tmp_path: Path, forks: Forks
) -> None:
    """Packing on, learning rate 0: MaxText's eval of the packed rows (several samples each,
    kept apart by their segment ids) equals transformers' eval of the HF model over the same
    samples one per row."""
    from primus.testing.sft_data import hf_eval_stats

    exp = experiment(tmp_path / "packed", task, packing=True, seq_length=96)
    with forked(forks, sft_runs):
        run = sft_runs.posttrain(exp, "steps=2", "eval_interval=1", "learning_rate=0",
                                 "enable_checkpointing=false")  # fmt: skip
    packed = sft_runs.eval_rows(exp)
    assert packed.num_samples > 2 * len(packed)  # several samples a row
    unpacked = sft_runs.eval_rows(experiment(tmp_path / "unpacked", task))
    stats = hf_eval_stats(task["hf"], unpacked)
    metrics = sft_runs.eval_lines(run)[1]
    assert metrics["eval_loss"] == pytest.approx(stats.loss, rel=1e-4)
    assert metrics["eval_token_accuracy"] == pytest.approx(stats.accuracy, abs=1e-6)


def test_dpo_is_refused(task: dict[str, Path], tmp_path: Path) -> None:
    """MaxText does not declare the dpo capability: `dpo:` is one error at its line, naming
    the backends that have it."""
    from primus.testing.dpo import write_preference_task

    exp = experiment(tmp_path / "dpo", task)
    written = yaml.safe_load(exp.read_text())
    module = written["modules"]["post_trainer"]
    module["sft"]["eval"] = None  # the recipe's eval file: none
    module["sft"]["train"] = str(write_preference_task(tmp_path / "pairs", 4)["train"])
    exp.write_text(
        yaml.safe_dump(written | {"modules": {"post_trainer": module | {"dpo": {"beta": 0.1}}}})
    )
    done = primus("train", "posttrain", "--config", str(exp), "--dry-run")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "the maxtext backend does not provide dpo" in done.stderr
    assert "backends that do: megatron, torchtitan" in done.stderr
    line = next(n for n, text in enumerate(exp.read_text().splitlines(), 1) if "dpo:" in text)
    assert f"error: {exp}:{line}:" in done.stderr


def test_the_gpu_recipe_builds_against_the_published_model(
    task: dict[str, Path], tmp_path: Path, forks: Forks
) -> None:
    """llama3.2_1B-sft.yaml with Llama-3.2-1B's published config.json (no weights: a dry run,
    forked by `forks`) passes the architecture check and MaxText's config validation, packing
    on."""
    with forked(forks, sft_runs):
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


# LoRA: one short run of the recipe, adapters on five of the seven projections (k_proj and
# up_proj keep none, so the export must leave them as they were)
LORA_TARGETS = ["q_proj", "v_proj", "o_proj", "gate_proj", "down_proj"]
LORA_STEPS = 20


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory: pytest.TempPathFactory, task: dict[str, Path], forks: Forks) -> Path:
    """The recipe with `peft:` (rank 4, alpha 8) for 20 steps, evals at 10 and 20, a
    checkpoint at MaxText's step 19: `primus train posttrain` forked by `forks`, with
    faults/sitecustomize.py's patch that also saves the trained model's frozen weights in
    `frozen.npz` beside the experiment (PRIMUS_TEST_FROZEN): the run directory."""
    peft = {"type": "lora", "rank": 4, "alpha": 8, "target_modules": LORA_TARGETS}
    exp = experiment(tmp_path_factory.mktemp("lora") / "lora", task, peft=peft)
    overrides = [f"steps={LORA_STEPS}", "eval_interval=10", f"checkpoint_period={LORA_STEPS}"]
    done = forks.run(["train", "posttrain", "--config", str(exp), *overrides],
                     {"PRIMUS_TEST_FROZEN": str(exp.with_name("frozen.npz"))},
                     reload=("sitecustomize",))  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return sft_runs.run_dir(exp)


@pytest.fixture(scope="module")
def lora_exports(lora_run: Path) -> tuple[Path, Path]:
    """`primus checkpoint export --hf --adapter` of the LoRA run, in this process: (the
    merged HF model, the PEFT adapter)."""
    import torch  # noqa: F401  (a conversion hides torch when it is not imported yet)

    from primus.testing.fuzz_runs import run_in_process

    exp = sft_runs.experiment_of(lora_run)
    merged, adapter = exp.parent / "merged", exp.parent / "adapter"
    done = run_in_process(["checkpoint", "export", "--config", str(exp), "--hf", str(merged),
                           "--adapter", str(adapter)], exp.parent, {})  # fmt: skip
    assert done.code == 0, done.stderr[-3000:]
    return merged, adapter


def _checkpoint_leaves(step: Path) -> list[str]:
    import jax
    import orbax.checkpoint as ocp

    metadata = ocp.PyTreeCheckpointer().metadata(step / "items")
    tree = getattr(metadata, "item_metadata", metadata)
    leaves = jax.tree_util.tree_leaves_with_path(getattr(tree, "tree", tree))
    return [
        "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path) for path, _ in leaves
    ]


def test_lora_trains_the_adapters_alone(lora_run: Path, task: dict[str, Path]) -> None:
    """The run says LoRA; its eval loss falls well below the HF model's; its checkpoint holds
    the targeted projections' adapters and Adam's state for them alone (no state for a frozen
    weight)."""
    log = (lora_run / "logs" / "rank-0.log").read_text()
    assert "[maxtext] LoRA: rank 4, alpha 8 (scaling 2), on q_proj, v_proj, o_proj" in log
    sft_runs.assert_adapters_learned(lora_run, task["hf"], LORA_STEPS)
    losses = [m["loss"] for m in step_metrics(lora_run)]
    assert max(losses[-5:]) < losses[0] - 0.5, losses
    leaves = _checkpoint_leaves(lora_run / "checkpoints" / str(LORA_STEPS - 1))
    weights = [leaf for leaf in leaves if leaf.startswith("params/")]
    modules = ["query", "value", "out", "wi_0", "wo"]
    assert len(weights) == 2 * len(modules), weights
    assert all(w.rsplit("/", 2)[-2] in modules and "_lora_" in w for w in weights), weights
    moments = [leaf for leaf in leaves if "/mu/" in leaf or "/nu/" in leaf]
    assert len(moments) == 2 * len(weights) and all("_lora_" in m for m in moments), moments


def test_the_frozen_weights_are_the_imports_bits_after_training(lora_run: Path) -> None:
    """The LoRA run's model after training: every weight but the adapters is the HF import's,
    bit for bit (the weights as the trained model holds them)."""
    import orbax.checkpoint as ocp

    trained = dict(np.load(lora_run.parents[3] / "frozen.npz"))
    items = ocp.PyTreeCheckpointer().restore(lora_run / "hf_import" / "0" / "items")
    imported = {"/".join(path): np.asarray(leaf) for path, leaf in _flat(items["params"]["params"])}
    assert sorted(trained) == sorted(imported) and len(trained) == 12, sorted(trained)
    for key, weight in trained.items():
        assert np.array_equal(weight, imported[key]), key


def _flat(tree: Any, path: tuple[str, ...] = ()) -> Any:
    if isinstance(tree, dict):
        for name, sub in tree.items():
            yield from _flat(sub, (*path, name))
    else:
        yield path, tree


def test_lora_export_is_the_hf_model_plus_the_adapters(
    lora_run: Path, lora_exports: tuple[Path, Path], task: dict[str, Path]
) -> None:
    """The merged export holds the HF model's tensors bit for bit where no adapter was and
    changed ones where one was, and transformers' eval of it equals the run's last eval: the
    run trained on the frozen HF weights plus the adapters."""
    merged, _ = lora_exports
    sft_runs.assert_merged_only(task["hf"], merged, LORA_TARGETS)
    exp = sft_runs.experiment_of(lora_run)
    sft_runs.assert_evaluates_as(merged, exp, sft_runs.eval_lines(lora_run)[LORA_STEPS])


def test_peft_adapter_on_the_hf_model_gives_the_merged_logits(
    lora_exports: tuple[Path, Path], task: dict[str, Path]
) -> None:
    """The PEFT adapter (rank 4, alpha 8, the five targets), loaded by peft onto the HF
    model, gives the merged export's logits, which are not the HF model's."""
    import json

    import torch

    from primus.testing.hf_models import hf_logits

    merged, adapter = lora_exports
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"]) == (4, 8.0)
    assert sorted(config["target_modules"]) == sorted(LORA_TARGETS)
    assert len(sft_runs.safetensors(adapter)) == 2 * len(LORA_TARGETS) * 2  # A, B per layer
    sft_runs.assert_adapter_is_the_merged_export(task["hf"], adapter, merged)
    tokens = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(0))
    assert (hf_logits(merged, tokens) - hf_logits(task["hf"], tokens)).abs().max() > 0.05


def test_the_peft_adapter_reads_back_as_the_runs_adapters(
    lora_run: Path, lora_exports: tuple[Path, Path], task: dict[str, Path]
) -> None:
    """`init_from.adapter`'s conversion, in this process: the exported PEFT adapter, read back
    for MaxText's model (through the import's hooks), is the run's checkpoint adapters, bit for
    bit. (A run continuing it at learning rate 0 keeps it bit for bit, and evaluates as the
    run it came from: checked by hand; the run is not in the tests.)"""
    from primus.backends.maxtext.checkpoint.hf_mapping import maxtext_config
    from primus.backends.maxtext.checkpoint.lora import peft_start, read_adapters
    from primus.core.patches.rebind import restore_all
    from primus.core.runtime.primus_runtime import PrimusRuntime

    try:
        exp = sft_runs.experiment_of(lora_run)
        config = maxtext_config(PrimusRuntime(exp, [], "posttrain").backend_args().argv)
    finally:
        restore_all()
    saved = read_adapters(config, lora_run / "checkpoints" / str(LORA_STEPS - 1))
    start = peft_start(config, task["hf"], lora_exports[1])
    assert sorted(start) == sorted(saved) and len(saved) == len(LORA_TARGETS)
    for key, (a, b) in saved.items():
        assert np.array_equal(start[key][0], a) and np.array_equal(start[key][1], b), key


@pytest.mark.parametrize(
    ("change", "key", "says"),
    [
        ("peft.dropout=0.1", "peft.dropout", "drops the adapters' inputs in eval too"),
        ("gradient_accumulation_steps=2", "gradient_accumulation_steps", "every weight"),
    ],
)
def test_lora_settings_maxtext_cannot_train_are_refused(
    task: dict[str, Path], tmp_path: Path, change: str, key: str, says: str
) -> None:
    """What MaxText's LoRA cannot do is one error at the setting, no traceback (exit 2)."""
    exp = experiment(tmp_path / "refused", task, peft={"type": "lora", "rank": 4})
    done = primus("train", "posttrain", "--config", str(exp), "--dry-run", change)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: cli ({change}): maxtext: {errors[0].split('maxtext: ', 1)[1]}"]
    assert says in errors[0] and key in errors[0]


def test_lora_keeps_a_bfloat16_projection_in_bfloat16() -> None:
    """A bfloat16 projection with float32 parameters (MaxText's bf16 recipes): qwix's own
    provider returns its adapted output in float32, which GPU flash attention refuses beside
    bf16 q and k; Primus's keeps bfloat16, the value unchanged but for that rounding."""
    import jax.numpy as jnp
    import qwix
    from flax import nnx

    from primus.backends.maxtext.posttrain.lora_provider import LoraProvider

    x = jnp.linspace(-1, 1, 16, dtype=jnp.bfloat16).reshape(2, 8)
    outputs = {}
    for name, provider in (("qwix", qwix.LoraProvider), ("primus", LoraProvider)):
        linear = nnx.Linear(8, 4, dtype=jnp.bfloat16, param_dtype=jnp.float32, rngs=nnx.Rngs(0))
        lora = qwix.apply_lora_to_model(linear, provider(module_path=".*", rank=2, alpha=2.0), x)
        for _, node in nnx.iter_graph(lora):  # B is zeros at first: make the adapter count
            if isinstance(node, nnx.LoRAParam) and not node.get_value().any():
                node.set_value(jnp.full(node.get_value().shape, 0.5, jnp.float32))
        outputs[name] = lora(x)
    assert outputs["qwix"].dtype == jnp.float32
    assert outputs["primus"].dtype == jnp.bfloat16
    assert jnp.allclose(outputs["primus"].astype(jnp.float32), outputs["qwix"], rtol=1e-2)
    assert not jnp.allclose(outputs["primus"], linear(x).astype(jnp.bfloat16))  # adapted
