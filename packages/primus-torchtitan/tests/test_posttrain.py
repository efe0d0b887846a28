"""`primus train posttrain` through TorchTitan's Trainer on CPU: a tiny Llama-3 HF model (with
its tokenizer) fine-tuned on the reverse-words task from its import, resumed, exported; the rows
TorchTitan's dataloader yields against the tokenizer's chat template; a packed eval against
transformers. LoRA (q and v apart on TorchTitan's fused q/k/v linear, as PEFT's modules): only
the adapters train and are checkpointed, the frozen weights stay the HF import's, the merged
export gives the adapted model's logits and eval, and PEFT's own adapter continues."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch

from primus.testing import sft_runs
from primus.testing.in_process import in_process
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
    run_dir,
    sft_experiment,
    shipped_run,
)

pytestmark = pytest.mark.slow
RECIPE = Path(__file__).parents[3] / "configs" / "torchtitan" / "sft-tiny-cpu.yaml"
STEPS = 600  # the recipe's


def experiment(folder: Path, task: dict[str, Path], **keys: Any) -> Path:
    return sft_experiment(RECIPE, folder, task, **keys)


@pytest.fixture(scope="module")
def task(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_task(tmp_path_factory.mktemp("task"))


@pytest.fixture(scope="module")
def finetuned(tmp_path_factory: pytest.TempPathFactory, task: dict[str, Path]) -> Path:
    """The recipe run as shipped (600 steps, eval every 100, a checkpoint every 100)."""
    with in_process(sft_runs):
        return shipped_run(RECIPE, tmp_path_factory.mktemp("sft") / "sft", task)


def test_the_rows_torchtitan_reads_train_on_the_assistant_tokens(
    task: dict[str, Path], tmp_path: Path
) -> None:
    """A batch as the run's dataloader yields it: the targets TorchTitan's loss counts (not the
    ignore index) are the assistant's answer and <|eot_id|>, as the tokenizer's own chat
    template writes them; positions count from 0."""
    from transformers import AutoTokenizer

    from primus.core.posttrain import build_sft_data
    from primus.testing.torchtitan import runtime

    exp = experiment(tmp_path, task)
    data = build_sft_data(module_of(exp).sft)
    with runtime(exp) as rt:
        config = rt.backend_args()
        config.dataloader._rows = data.train
        loader = config.dataloader.build(dp_world_size=1, dp_rank=0, local_batch_size=8)
        inputs, labels = next(iter(loader))
    records = [json.loads(line) for line in task["chat_train"].read_text().splitlines()]
    tokenizer = AutoTokenizer.from_pretrained(task["hf"])
    for position in range(8):
        (sample,) = data.train.rows[data.train.order(0)[position]]
        messages = records[sample]["messages"]
        text = tokenizer.apply_chat_template(messages, tokenize=False)
        full = tokenizer(text, add_special_tokens=False)["input_ids"]
        answer = tokenizer(messages[-1]["content"], add_special_tokens=False)["input_ids"]
        trained = labels[position][labels[position] != -100].tolist()
        assert trained == [*answer, tokenizer.convert_tokens_to_ids("<|eot_id|>")]
        assert inputs["input"][position][: len(full) - 1].tolist() == full[:-1]
        assert inputs["positions"][position][: len(full) - 1].tolist() == list(range(len(full) - 1))


def test_data_parallel_ranks_split_each_global_batch(task: dict[str, Path], tmp_path: Path) -> None:
    """Two ranks, two micro-batches a step: together they read each step's global batch,
    the rows one rank would read (the loss is one sum over the global batch)."""
    from primus.backends.torchtitan.posttrain.sft import SFTRows
    from primus.core.posttrain import build_sft_data

    rows = build_sft_data(module_of(experiment(tmp_path, task)).sft).train
    one = SFTRows(rows, 16, 0, 1)
    ranks = [SFTRows(rows, 16, r, 2) for r in range(2)]
    for step in range(3):
        expected = {one.position(step * 16 + i) for i in range(16)}
        read = {rank.position(step * 8 + i) for rank in ranks for i in range(8)}
        assert read == expected == set(range(step * 16, step * 16 + 16))


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_two_data_parallel_ranks_train_as_one(
    task: dict[str, Path], tmp_path: Path, lora: bool
) -> None:
    """Two processes (gloo, FSDP), each reading its two micro-batches of 8 rows of every global
    batch of 32: the same losses and eval as one process reading 32 rows a step (the loss is
    one masked mean over the global batch; LoRA's A is drawn whole, whatever the sharding)."""
    peft = LORA if lora else None
    short = ("training.steps=10", "validator.freq=10", "metrics.log_freq=5",
             "checkpoint.enable=false")  # fmt: skip
    with in_process(sft_runs):
        one = posttrain(experiment(tmp_path / "dp1", task, peft=peft), *short)
    two = posttrain(experiment(tmp_path / "dp2", task, peft=peft), "--nproc-per-node", "2",
                    *short, "training.local_batch_size=8", "training.global_batch_size=32")  # fmt: skip
    assert_continues(one, two, 0)


def test_finetuning_learns_the_reverse_task(finetuned: Path) -> None:
    assert_learned(finetuned, STEPS)
    assert sorted(eval_lines(finetuned)) == [1, 100, 200, 300, 400, 500, 600]
    assert "starts from the imported weights" in (finetuned / "logs" / "rank-0.log").read_text()


def test_the_export_evaluates_as_the_run_did(finetuned: Path, tmp_path: Path) -> None:
    with in_process(sft_runs):
        assert_export_evaluates_as_run(finetuned, tmp_path / "hf", STEPS)


def assert_resumes_exactly(run: Path, exp: Path, step: int, *overrides: str) -> None:
    """`exp` run from `run`'s checkpoint at `step` (a new run directory holding only the HF
    import and that checkpoint) logs `run`'s losses and evals from there on."""
    resumed(run, exp, ["checkpoint/hf_import", f"checkpoint/step-{step}"])
    with in_process(sft_runs):
        assert_continues(run, posttrain(exp, *overrides), step)


def test_resume_continues_exactly(finetuned: Path, task: dict[str, Path], tmp_path: Path) -> None:
    assert_resumes_exactly(finetuned, experiment(tmp_path / "resumed", task), 500)


@pytest.mark.parametrize("attention", ["flex", "varlen"])
def test_packed_rows_attend_within_their_sample(
    task: dict[str, Path], tmp_path: Path, attention: str
) -> None:
    """Packing on, learning rate 0: the eval of the packed rows (several samples each, each
    with positions from 0: TorchTitan's document mask, or varlen's documents) equals
    transformers' eval of the HF model over the same samples one per row."""
    exp = experiment(tmp_path / "packed", task, packing=True, seq_length=96)
    with in_process(sft_runs):
        run = posttrain(exp, "training.steps=2", "validator.freq=2", "metrics.log_freq=1",
                        "optimizer.lr=0", "checkpoint.enable=false",
                        f"model.attn_backend={attention}")  # fmt: skip
    packed = eval_rows(exp)
    assert packed.num_samples > len(packed)  # several samples a row
    assert_evaluates_as(task["hf"], experiment(tmp_path / "unpacked", task), eval_lines(run)[2])


def test_the_gpu_recipe_builds_against_the_published_model(
    task: dict[str, Path], tmp_path: Path
) -> None:
    """llama3.2_1B-sft.yaml with Llama-3.2-1B's published config.json (no weights: a dry run)
    passes the architecture check and TorchTitan's config, packing on, compiled."""
    recipe = RECIPE.with_name("llama3.2_1B-sft.yaml")
    hf, stdout = published_dry_run(recipe, task, tmp_path)
    assert "TorchTitanPosttrainTrainer" in stdout
    for line in ("seq_len: 4096", "mixed_precision_param: bfloat16", f"hf_assets_path: {hf}",
                 "dataset: sft"):  # fmt: skip
        assert line in {text.strip() for text in stdout.splitlines()}, line
    assert "\n  enable: true\n" in stdout.split("\nvalidator:\n")[1]  # the 5% held out
    compiled = re.search(r"^compile:\n((?:  .*\n)*)", stdout, re.MULTILINE)
    assert compiled is not None and "  enable: true\n" in compiled[1], stdout


# -- LoRA ----------------------------------------------------------------------------
LORA_STEPS = 60
TARGETS = ["q_proj", "v_proj", "o_proj", "up_proj", "down_proj"]  # not k_proj, gate_proj
LORA = {"type": "lora", "rank": 4, "alpha": 8.0, "target_modules": TARGETS}
TRAIN = (f"training.steps={LORA_STEPS}", "metrics.log_freq=10", "validator.freq=30",
         "checkpoint.interval=30")  # fmt: skip


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory: pytest.TempPathFactory, task: dict[str, Path]) -> Path:
    """The LoRA fine-tune (q and v on the fused wqkv; o, up, down) from the HF import, run by
    frozen_weights.py (`primus train posttrain`'s runtime, in a subprocess), which also saves the
    trained model's frozen weights in `frozen.pt` beside the experiment: the run directory."""
    import subprocess
    import sys

    exp = experiment(tmp_path_factory.mktemp("lora") / "lora", task, peft=LORA)
    script = Path(__file__).with_name("frozen_weights.py")
    done = subprocess.run([sys.executable, str(script), str(exp), str(exp.with_name("frozen.pt")),
                           *TRAIN], capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return run_dir(exp)


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory, lora_run: Path) -> Path:
    """The LoRA run exported: the HF directory (merged), and beside it the PEFT adapter."""
    folder = tmp_path_factory.mktemp("merged")
    with in_process(sft_runs):
        return export(lora_run.parents[3] / "exp.yaml", folder / "hf", folder / "adapter")


def test_only_the_adapters_train_and_are_checkpointed(lora_run: Path) -> None:
    import torch.distributed.checkpoint as dcp

    step = lora_run / "checkpoint" / f"step-{LORA_STEPS}"
    stored = dcp.FileSystemReader(str(step)).read_metadata().state_dict_metadata
    tensors = [k for k, v in stored.items() if hasattr(v, "size")]
    model = [k for k in tensors if not k.startswith("optimizer.")]
    paths = ("attention.wo", "feed_forward.w3", "feed_forward.w2")
    qkv = "attention.qkv_linear.wqkv"
    assert sorted(model) == sorted(
        [f"layers.{layer}.{path}.lora_{side}.weight"
         for layer in range(2) for path in paths for side in "ab"]
        + [f"layers.{layer}.{qkv}.lora_{side}.{part}.weight"
           for layer in range(2) for part in ("wq", "wv") for side in "ab"]
    )  # fmt: skip
    optimizer = {k.split(".", 2)[-1] for k in tensors if k.startswith("optimizer.")}
    assert optimizer and all(".lora_" in k for k in optimizer), optimizer
    log = (lora_run / "logs" / "rank-0.log").read_text()
    assert "Optimizer AdamW (model_part=0): 20 params" in log


def test_the_adapters_learn(lora_run: Path, task: dict[str, Path]) -> None:
    assert_adapters_learned(lora_run, task["hf"], LORA_STEPS)


def test_the_merged_export_keeps_the_frozen_weights(exported: Path, task: dict[str, Path]) -> None:
    assert_merged_only(task["hf"], exported, TARGETS)


def titan_lora_logits(run: Path, tokens: torch.Tensor, step: int = LORA_STEPS) -> torch.Tensor:
    """TorchTitan's fp32 forward of the adapted model: the frozen weights from the run's HF
    import, the adapters from its checkpoint of `step`."""
    import torch.distributed.checkpoint as dcp

    from primus.backends.torchtitan.posttrain.lora import is_adapter
    from primus.testing.torchtitan import runtime

    with runtime(run.parents[3] / "exp.yaml", *TRAIN) as rt:
        model = rt.backend_args().model_spec.model.build()
        model.init_weights(buffer_device=None)
        state = model.state_dict()
        base = {k: v for k, v in state.items() if not is_adapter(k)}
        adapters = {k: v for k, v in state.items() if is_adapter(k)}
        checkpoint = run / "checkpoint"
        dcp.load(base, checkpoint_id=str(checkpoint / "hf_import"), no_dist=True)
        dcp.load(adapters, checkpoint_id=str(checkpoint / f"step-{step}"), no_dist=True)
        model.load_state_dict({**base, **adapters})
        positions = torch.arange(tokens.shape[1]).expand(tokens.shape)
        with torch.no_grad():
            return model(tokens, positions, model.get_attention_masks(positions))


def test_the_merged_export_gives_the_adapted_models_logits(lora_run: Path, exported: Path) -> None:
    from primus.testing.hf_models import hf_logits

    tokens = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(0))
    ours = titan_lora_logits(lora_run, tokens)
    assert (ours - hf_logits(exported, tokens)).abs().max() <= 1e-4


def test_the_peft_adapter_gives_the_merged_exports_logits(
    exported: Path, task: dict[str, Path]
) -> None:
    """`checkpoint export --adapter`: peft loads it onto the HF model the run started from,
    with the logits of the merged export (fp32): q and v apart, in HF's row order."""
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
            exp, adapter, "training.steps=2", "checkpoint.interval=2", "optimizer.lr=0"
        )


def test_the_merged_export_evaluates_as_the_run_did(lora_run: Path, exported: Path) -> None:
    """The run's last eval used the in-memory frozen weights: equal to transformers' eval of
    the import's weights with the adapters merged, so training left them as imported."""
    assert_evaluates_as(
        exported, lora_run.parents[3] / "exp.yaml", eval_lines(lora_run)[LORA_STEPS]
    )


def test_lora_resumes_exactly(lora_run: Path, task: dict[str, Path], tmp_path: Path) -> None:
    """Resumed from its adapters-only checkpoint at step 30 (the frozen weights from the HF
    import, the adapters, their optimizer state and the rows read from the checkpoint)."""
    exp = experiment(tmp_path / "lora_resumed", task, peft=LORA)
    assert_resumes_exactly(lora_run, exp, 30, *TRAIN)


def test_lora_dropout_drops_the_adapters_input_in_training_only() -> None:
    """`peft.dropout` on TorchTitan's LoRA linear: the adapter's output is that of its input
    with dropout (PEFT's lora_dropout) in training, of the input itself in eval; the base
    path keeps the whole input."""
    from torchtitan.components.lora import _get_lora_cls
    from torchtitan.models.common import Linear

    from primus.backends.torchtitan.posttrain.lora import add_dropout

    torch.manual_seed(0)
    config = _get_lora_cls(Linear).Config(in_features=16, out_features=8, bias=False, rank=4,
                                          alpha=8.0)  # fmt: skip
    linear = config.build()
    torch.nn.init.normal_(linear.lora_b.weight)
    assert add_dropout(torch.nn.Sequential(linear), 0.5) == 1
    x = torch.randn(64, 16)
    base, scaling = x @ linear.weight.T, 8.0 / 4

    def adapter(inputs: torch.Tensor) -> torch.Tensor:  # by the weights: no hook on the way
        return scaling * inputs @ linear.lora_a.weight.T @ linear.lora_b.weight.T

    torch.manual_seed(1)
    trained = linear.train()(x)
    torch.manual_seed(1)
    dropped = torch.nn.functional.dropout(x, 0.5, training=True)
    assert torch.allclose(trained, base + adapter(dropped), atol=1e-6)
    assert not torch.allclose(trained, base + adapter(x), atol=1e-3)
    assert torch.allclose(linear.eval()(x), base + adapter(x), atol=1e-6)


def test_each_part_of_the_fused_qkv_adds_its_own_update(
    task: dict[str, Path], tmp_path: Path
) -> None:
    """q, k and v targeted (GQA, 2 q heads a kv group): the fused linear's output is that of
    the three projections of TorchTitan's checkpoint (wq, wk, wv), each with its own update
    (alpha / rank) B A; with the adapters off (DPO's reference), the fused weight's alone."""
    from torchtitan.models.common.attention import FusedQKVLinear

    from primus.backends.torchtitan.posttrain.lora import adapters_off
    from primus.testing.torchtitan import runtime

    peft = {**LORA, "target_modules": ["q_proj", "k_proj", "v_proj"]}
    with runtime(experiment(tmp_path, task, peft=peft)) as rt:
        model = rt.backend_args().model_spec.model.build()
    qkv = model.layers["0"].attention.qkv_linear
    linear, parts = qkv.wqkv, {}
    torch.manual_seed(0)
    for part in ("wq", "wk", "wv"):
        a, b = (
            torch.nn.init.normal_(adapter[part].weight)
            for adapter in (linear.lora_a, linear.lora_b)
        )
        parts[part] = (b @ a * LORA["alpha"] / LORA["rank"]).detach()
    weights = {"wqkv.weight": linear.weight.detach()}
    FusedQKVLinear._split_qkv_on_save(qkv, weights, "", None)
    weights = {f"{part}.weight": weights[f"{part}.weight"] + parts[part] for part in parts}
    FusedQKVLinear._merge_qkv_on_load(qkv, weights, "")
    x = torch.randn(2, 5, linear.in_features)
    with torch.no_grad():
        torch.testing.assert_close(linear(x), x @ weights["wqkv.weight"].T, rtol=1e-5, atol=1e-4)
        with adapters_off(model):
            assert torch.equal(linear(x), torch.nn.functional.linear(x, linear.weight))


def test_peft_adapter_on_q_and_v_continues_with_its_logits(
    task: dict[str, Path], tmp_path: Path
) -> None:
    """PEFT's own LoraConfig(target_modules=[q_proj, v_proj]), random A and B, continued by a
    run (`init_from.adapter`) at learning rate 0: TorchTitan's logits with the adapters of the
    run's checkpoint are PEFT's (fp32)."""
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM

    targets = ["q_proj", "v_proj"]
    torch.manual_seed(0)
    config = LoraConfig(r=LORA["rank"], lora_alpha=LORA["alpha"], target_modules=targets,
                        init_lora_weights=False)  # fmt: skip
    base = AutoModelForCausalLM.from_pretrained(task["hf"], dtype=torch.float32)
    get_peft_model(base, config).save_pretrained(tmp_path / "adapter")
    exp = experiment(tmp_path / "qv", task, peft={**LORA, "target_modules": targets},
                     adapter=tmp_path / "adapter")  # fmt: skip
    with in_process(sft_runs):
        run = posttrain(exp, "training.steps=2", "checkpoint.interval=2", "optimizer.lr=0")
    tokens = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(0))
    base = AutoModelForCausalLM.from_pretrained(task["hf"], dtype=torch.float32)
    with torch.no_grad():
        theirs = PeftModel.from_pretrained(base, tmp_path / "adapter").eval()(tokens).logits
    assert (titan_lora_logits(run, tokens, 2) - theirs).abs().max() <= 1e-4


def test_the_frozen_weights_are_the_imports_bits_after_training(lora_run: Path) -> None:
    """The LoRA run's model after training: every weight but the adapters is the HF import's,
    bit for bit (the weights as the trained model holds them)."""
    import torch.distributed.checkpoint as dcp

    trained = torch.load(lora_run.parents[3] / "frozen.pt")
    imported = {k: torch.empty_like(v) for k, v in trained.items()}
    dcp.load(imported, checkpoint_id=str(lora_run / "checkpoint" / "hf_import"), no_dist=True)
    assert len(trained) == 21  # wq, wk, wv, wo, w1, w2, w3, 2 norms a layer; embeddings, norm, head
    for key, tensor in trained.items():
        assert torch.equal(tensor, imported[key]), key
