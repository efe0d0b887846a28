"""`primus checkpoint` on TorchTitan: presets from HF configs, `inspect` of a DCP checkpoint, and
HF import/export. One real CPU run (`init_from` a tiny random Llama-3 HF model, 4 steps, a
checkpoint every 2) serves every test; it, the imports and the exports run in this process."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file

from primus.core.errors import ConfigError
from primus.testing import runs
from primus.testing.checkpoints import (
    derived_preset,
    export_of_nothing,
    inspect_json,
    resolved_model,
)
from primus.testing.hf_models import HF_CONFIGS, hf_config, hf_logits, hf_loss, make_hf_model
from primus.testing.in_process import in_process, primus_here
from primus.testing.runs import losses, primus, train_run
from primus.testing.torchtitan import first_batch, runtime

pytestmark = pytest.mark.slow
RECIPE = Path(__file__).parents[3] / "configs" / "torchtitan" / "tiny-cpu.yaml"
ARCHITECTURE = ("family", "dim", "n_layers", "n_heads", "n_kv_heads", "ffn_hidden_dim",
                "vocab_size", "rope_theta", "rope_scaling", "rope_scaling_factor", "max_seq_len")  # fmt: skip
# TINY_CONFIGS' llama3 (Llama-3.2 RoPE scaling) in the shape of the `tiny` preset
TINY_LLAMA = {"hidden_size": 64, "intermediate_size": 176, "vocab_size": 512}
LLAMA_MODEL = {"max_seq_len": 16384, "rope_scaling": "llama", "rope_scaling_factor": 32.0}
QWEN3_MODEL = {"family": "qwen3", "dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2,
               "head_dim": 32, "ffn_hidden_dim": 128, "vocab_size": 256,
               "rope_theta": 1000000.0, "max_seq_len": 4096}  # fmt: skip


def experiment(folder: Path, hf_dir: Path, model: dict[str, Any]) -> Path:
    """The tiny recipe starting from `hf_dir`, with `model` overrides, in workspace `folder`."""
    exp = folder / f"exp-{hf_dir.name}.yaml"
    module = {"init_from": {"hf": str(hf_dir)}, "overrides": {"model": model}}
    exp.write_text(yaml.safe_dump({"extends": str(RECIPE), "workspace": str(folder),
                                   "modules": {"pre_trainer": module}}))  # fmt: skip
    return exp


def titan_logits(args: Any, folder: Path, tokens: torch.Tensor) -> torch.Tensor:
    """TorchTitan's fp32 logits for `tokens`: the model of Trainer.Config `args` (built on the
    CPU, attention as the cpu patch runs it) with the weights of the DCP folder `folder`."""
    import torch.distributed.checkpoint as dcp

    model = args.model_spec.model.build()
    model.init_weights(buffer_device=None)
    state = model.state_dict()
    dcp.load(state, checkpoint_id=str(folder), no_dist=True)
    model.load_state_dict(state)  # q, k and v are views made by a hook: load them through it
    positions = torch.arange(tokens.shape[1]).expand(tokens.shape)
    with torch.no_grad():
        return model(tokens, positions, model.get_attention_masks(positions))


def assert_same_tensors(hf_dir: Path, exported: Path, dtype: torch.dtype | None = None) -> None:
    """Every tensor of `hf_dir` (cast to `dtype`, if given) is in `exported`, bit for bit, and
    nothing else is."""
    ours = {k: v for p in exported.glob("*.safetensors") for k, v in load_file(p).items()}
    theirs = {k: v for p in hf_dir.glob("*.safetensors") for k, v in load_file(p).items()}
    assert sorted(ours) == sorted(theirs)
    for name, tensor in theirs.items():
        tensor = tensor.to(dtype or tensor.dtype)
        assert ours[name].dtype == tensor.dtype and torch.equal(ours[name], tensor), name


def assert_source_config(hf_dir: Path, exported: Path, dtype: str | None = None) -> None:
    """The export's config.json is `hf_dir`'s (with `dtype`, if given); its
    generation_config.json too."""
    ours, theirs = (json.loads((f / "config.json").read_text()) for f in (exported, hf_dir))
    assert ours == theirs | ({"dtype": dtype} if dtype else {})
    generation = "generation_config.json"
    assert (exported / generation).read_bytes() == (hf_dir / generation).read_bytes()


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ws")


@pytest.fixture(scope="module")
def hf_llama(workspace: Path) -> Path:
    """The tiny HF Llama, with a tokenizer's files (an export without a tokenizer of its own
    carries them over)."""
    hf = make_hf_model(workspace / "hf_llama", "llama3", **TINY_LLAMA)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (hf / name).write_text(json.dumps({"file": name}))
    return hf


@pytest.fixture(scope="module")
def batch(workspace: Path, hf_llama: Path) -> torch.Tensor:
    """The tokens (batch, seq + 1) of the run's first step."""
    return first_batch(experiment(workspace, hf_llama, LLAMA_MODEL), "exp_name=ckpt")


@pytest.fixture(scope="module")
def run(workspace: Path, hf_llama: Path) -> Path:
    """`primus train` from the HF model (`init_from`) for 2 steps, then the same experiment again
    to step 4 (it resumes from its step-2 checkpoint, not from the HF weights)."""
    exp = experiment(workspace, hf_llama, LLAMA_MODEL)
    keep = (
        "exp_name=ckpt",
        "metrics.log_freq=1",
        "checkpoint.enable=true",
        "checkpoint.interval=2",
    )
    with in_process(runs):
        train_run(exp, workspace, *keep, "training.steps=2")
        return train_run(exp, workspace, *keep, "training.steps=4")


def test_preset_from_hf_config_matches_the_shipped_preset(tmp_path: Path) -> None:
    derived = derived_preset("torchtitan", HF_CONFIGS["llama3.1_8B"], tmp_path)
    ours = resolved_model("torchtitan", "torchtitan_pretrain", derived.name, tmp_path)["model"]
    shipped = resolved_model("torchtitan", "torchtitan_pretrain", "llama3.1_8B", tmp_path)["model"]
    assert {k: ours[k] for k in ARCHITECTURE} == {k: shipped[k] for k in ARCHITECTURE}
    assert ours["tie_embeddings"] is shipped.get("tie_embeddings", False) is False


def test_a_family_torchtitan_lacks_is_refused_naming_it(tmp_path: Path) -> None:
    hf_config("mixtral_8x7B").save_pretrained(tmp_path)  # a whole, valid Mixtral config.json
    result = primus("checkpoint", "preset", "--hf", str(tmp_path), "--framework", "torchtitan")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "model_type 'mixtral' has no TorchTitan model here" in result.stderr


def test_inspect_a_dcp_checkpoint_from_a_real_run(run: Path) -> None:
    info = inspect_json(run / "checkpoint")
    assert (info["backend"], info["iteration"], info["iterations_saved"]) == (
        "torchtitan",
        4,
        [2, 4],
    )
    assert info["model"] == {"vocab_size": 512, "dim": 64, "n_layers": 2, "ffn_hidden_dim": 176,
                             "q_proj": [64, 64], "kv_proj": [32, 64], "tie_embeddings": False}  # fmt: skip
    assert info["size"]["model_parameters"] == 158016  # the same tiny model as Megatron's
    assert info["provenance"]["run_dir"] == str(run.resolve())


def test_the_run_starts_from_the_hf_weights(run: Path, hf_llama: Path, batch: torch.Tensor) -> None:
    """Step 1's loss (before any update) is transformers' loss on the same batch."""
    assert (run / "checkpoint" / "hf_import" / ".metadata").is_file()
    log = (run / "logs" / "rank-0.log").read_text()
    assert f"Loading the checkpoint from {run / 'checkpoint' / 'hf_import'}" in log
    assert losses(run)[1] == pytest.approx(hf_loss(hf_llama, batch), rel=1e-5)


def test_a_resumed_run_prefers_its_own_checkpoint(run: Path) -> None:
    log = (run / "logs" / "rank-0.log").read_text()
    assert "init_from: " in log and "is there already; not importing again" in log
    assert f"Loading the checkpoint from {run / 'checkpoint' / 'step-2'}" in log
    assert log.count(f"Loading the checkpoint from {run / 'checkpoint' / 'hf_import'}") == 1
    assert sorted(losses(run)) == [1, 2, 3, 4]


def test_a_resume_with_another_model_is_refused_naming_the_tensor(tmp_path: Path) -> None:
    """DCP's failure on another model's checkpoint (a traceback) is one message, exit 2."""
    train = ("train", "pretrain", "--config", str(RECIPE), f"workspace={tmp_path}",
             "exp_name=other", "checkpoint.enable=true", "checkpoint.interval=2",
             "training.steps=2")  # fmt: skip
    with in_process():
        assert primus_here(*train).returncode == 0
        deeper = primus_here(*train, "model.n_layers=3")
    assert deeper.returncode == 2 and "Traceback" not in deeper.stderr, deeper.stderr[-3000:]
    assert "was saved by another model: Missing key in checkpoint state_dict: layers.2." in (
        deeper.stderr
    )
    assert "hint: resume with the model it was saved with" in deeper.stderr
    step = tmp_path / "local" / "local" / "other" / "checkpoint" / "step-2"  # a file cut short
    shard = max(step.glob("*.distcp"), key=lambda path: path.stat().st_size)
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    with in_process():
        damaged = primus_here(*train[:-1], "training.steps=4")
    assert damaged.returncode == 1 and "Traceback" not in damaged.stderr, damaged.stderr[-3000:]
    assert f"error: the checkpoint {step} cannot be read (" in damaged.stderr
    assert f"hint: a file in it may be damaged or cut short: move {step} out of" in damaged.stderr
    (step / ".metadata").write_bytes(b"\x80\x04garbage")  # its DCP index damaged: the same
    with in_process():
        damaged = primus_here(*train[:-1], "training.steps=4")
    assert damaged.returncode == 1 and "Traceback" not in damaged.stderr, damaged.stderr[-3000:]
    assert f"error: the checkpoint {step} cannot be read (UnpicklingError: " in damaged.stderr
    with in_process():  # and as another run's checkpoint.initial_load_path
        damaged = primus_here(*train[:4], f"workspace={tmp_path}", "exp_name=from_it",
                              "checkpoint.enable=true", f"checkpoint.initial_load_path={step}")  # fmt: skip
    assert damaged.returncode == 1 and "Traceback" not in damaged.stderr, damaged.stderr[-3000:]
    assert f"error: the checkpoint {step} cannot be read (UnpicklingError: " in damaged.stderr


def test_another_model_at_the_initial_load_path_is_named_so() -> None:
    """With no save of the run's own to resume from, TorchTitan read
    checkpoint.initial_load_path: that is what the error names, not the run's folder."""
    from types import SimpleNamespace

    from primus.backends.torchtitan.checkpoint.patches import _from_initial_load

    folder = Path(__file__).parent / "no-such-checkpoint"
    manager = SimpleNamespace(folder=str(folder), initial_load_path="/ckpt/step-5")
    assert _from_initial_load(manager, -1) and not _from_initial_load(manager, 2)
    assert not _from_initial_load(SimpleNamespace(folder=str(folder), initial_load_path=""), -1)


def test_imported_logits_match_transformers(
    workspace: Path, run: Path, hf_llama: Path, batch: torch.Tensor
) -> None:
    tokens = batch[:, :-1]
    with runtime(experiment(workspace, hf_llama, LLAMA_MODEL), "exp_name=ckpt") as rt:
        ours = titan_logits(rt.backend_args(), run / "checkpoint" / "hf_import", tokens)
    assert (ours - hf_logits(hf_llama, tokens)).abs().max() <= 1e-4


def test_export_of_the_import_is_the_hf_model_bit_for_bit(
    workspace: Path, run: Path, hf_llama: Path, batch: torch.Tensor
) -> None:
    out = workspace / "export-0"
    with runtime(experiment(workspace, hf_llama, LLAMA_MODEL), "exp_name=ckpt") as rt:
        rt.export_hf(0, out)
    assert_same_tensors(hf_llama, out)
    assert_source_config(hf_llama, out)  # max_position_embeddings, RoPE scaling and all
    for name in ("tokenizer.json", "tokenizer_config.json"):  # mock data: init_from's tokenizer
        assert (out / name).read_bytes() == (hf_llama / name).read_bytes()
    tokens = batch[:, :-1]
    assert (hf_logits(out, tokens) - hf_logits(hf_llama, tokens)).abs().max() <= 1e-4
    assert json.loads((out / "primus_provenance.json").read_text())  # core's record


def test_export_after_training_loads_in_transformers(
    workspace: Path, run: Path, hf_llama: Path, batch: torch.Tensor
) -> None:
    """`primus checkpoint export` of step 4: transformers' logits are TorchTitan's; the
    experiment's tokenizer folder (hf_assets_path) comes along, not init_from's; the rest is
    init_from's, and the dtype too."""
    tokenizer = workspace / "tokenizer"
    tokenizer.mkdir()
    (tokenizer / "tokenizer.json").write_text("{}")
    out = workspace / "export-4"
    exp = experiment(workspace, hf_llama, LLAMA_MODEL)
    with in_process():
        result = primus_here("checkpoint", "export", "--config", str(exp), "--hf", str(out),
                             "exp_name=ckpt", "mock_data=false", f"hf_assets_path={tokenizer}")  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "step-4" in result.stderr and (out / "tokenizer.json").read_text() == "{}"
    assert not (out / "tokenizer_config.json").exists()  # no tokenizers mixed
    assert_source_config(hf_llama, out)
    assert f"float32 tensors (the dtype of {hf_llama}, the HF model it was" in result.stderr
    tokens = batch[:, :-1]
    with runtime(exp, "exp_name=ckpt") as rt:
        ours = titan_logits(rt.backend_args(), run / "checkpoint" / "step-4", tokens)
    assert (hf_logits(out, tokens) - ours).abs().max() <= 1e-4


@pytest.mark.parametrize(
    ("family", "changes", "model", "bf16_source", "overrides"),
    [
        ("llama3", {**TINY_LLAMA, "tie_word_embeddings": True}, {**LLAMA_MODEL, "tie_embeddings": True},
         False, ["checkpoint.export_dtype=bfloat16"]),  # the option wins over the source's dtype
        ("qwen3", {}, QWEN3_MODEL, True, []),  # a bf16 source is exported in bf16
    ],
    ids=["llama3-tied", "qwen3-bf16"],
)  # fmt: skip
def test_import_and_export(tmp_path: Path, family: str, changes: dict[str, Any],
                           model: dict[str, Any], bf16_source: bool, overrides: list[str]) -> None:  # fmt: skip
    from transformers import AutoModelForCausalLM

    hf_dir = make_hf_model(tmp_path / "hf", family, seed=1, **changes)
    if bf16_source:
        made = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.bfloat16)
        hf_dir = tmp_path / "hf-bf16"
        made.save_pretrained(hf_dir)
    exp, out = experiment(tmp_path, hf_dir, model), tmp_path / "export"
    tokens = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    with runtime(exp, "exp_name=run", *overrides) as rt:
        folder = rt.import_hf(hf_dir)
        ours = titan_logits(rt.backend_args(), folder, tokens)
        rt.export_hf(None, out)
    assert (ours - hf_logits(hf_dir, tokens)).abs().max() <= 1e-4
    assert_same_tensors(hf_dir, out, torch.bfloat16)
    assert_source_config(hf_dir, out, "bfloat16")
    assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is bool(changes)


@pytest.mark.parametrize("family", ["qwen2.5", "mixtral"])
def test_import_refuses_a_family_torchtitan_lacks(tmp_path: Path, family: str) -> None:
    hf_dir = make_hf_model(tmp_path / "hf", family)
    exp = experiment(tmp_path, hf_dir, {})
    with pytest.raises(ConfigError, match="has no TorchTitan model here"), runtime(exp) as rt:
        rt.import_hf(hf_dir)
    assert not list(tmp_path.rglob("hf_import"))


def _rewrite(hf_dir: Path, change: Any) -> None:
    path = hf_dir / "model.safetensors"
    tensors = load_file(path)
    change(tensors)
    save_file(tensors, path, metadata={"format": "pt"})


def _truncate(hf_dir: Path) -> None:
    path = hf_dir / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-1000])


BAD = {
    "missing": (lambda d: _rewrite(d, lambda t: t.pop("model.layers.1.mlp.up_proj.weight")),
                "tensor 'model.layers.1.mlp.up_proj.weight' is in none of model.safetensors"),
    "int": (lambda d: _rewrite(d, lambda t: t.update({"model.norm.weight": torch.ones(64, dtype=torch.int32)})),
            "model.safetensors: tensor 'model.norm.weight': dtype I32 is not a floating-point dtype"),
    "shape": (lambda d: _rewrite(d, lambda t: t.update({"model.layers.0.self_attn.o_proj.weight": torch.ones(64, 32)})),
              "model.safetensors: tensor 'model.layers.0.self_attn.o_proj.weight': shape [64, 32], TorchTitan's 'layers.0.attention.wo.weight' is [64, 64]"),
    "nan": (lambda d: _rewrite(d, lambda t: t["model.layers.1.mlp.down_proj.weight"].view(-1).__setitem__(5, torch.nan)),
            "model.safetensors: tensor 'model.layers.1.mlp.down_proj.weight' holds nan at element 5"),
    "truncated": (_truncate, "model.safetensors: truncated safetensors file: tensor 'model.layers.1.self_attn.v_proj.weight' ends at byte"),
    "architecture": (lambda d: (d / "config.json").write_text((d / "config.json").read_text().replace('"intermediate_size": 176', '"intermediate_size": 128')),
                     "config.json does not match the experiment's model:\n  model.ffn_hidden_dim: 128 in the HF config, 176"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(BAD))
def test_bad_hf_models_are_refused_naming_file_and_tensor(
    tmp_path: Path, hf_llama: Path, case: str
) -> None:
    hf_dir = tmp_path / "hf"
    shutil.copytree(hf_llama, hf_dir)
    spoil, message = BAD[case]
    spoil(hf_dir)
    exp = experiment(tmp_path, hf_dir, LLAMA_MODEL)
    with pytest.raises(ConfigError) as error, runtime(exp, "exp_name=run") as rt:
        rt.import_hf(hf_dir)  # the architecture is checked as the experiment loads
    assert message in str(error.value)
    assert not list(tmp_path.rglob("*hf_import*"))  # nothing half-written


def test_a_truncated_file_is_a_config_error_on_the_command_line(
    tmp_path: Path, hf_llama: Path
) -> None:
    hf_dir = tmp_path / "hf"
    shutil.copytree(hf_llama, hf_dir)
    _truncate(hf_dir)
    exp = experiment(tmp_path, hf_dir, LLAMA_MODEL)
    result = primus(
        "checkpoint", "import", "--hf", str(hf_dir), "--config", str(exp), "exp_name=run"
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert f"{hf_dir / 'model.safetensors'}: truncated safetensors file: tensor '" in result.stderr
    assert not list(tmp_path.rglob("hf_import*")) and not list(tmp_path.rglob(".hf_import*"))


def test_the_fixed_rope_scaling_read_from_torchtitans_source_is_what_it_runs() -> None:
    """`checkpoint preset` reads TorchTitan's fixed Llama-3 scaling constants from its source,
    without importing it; they are the field defaults of the RoPE config TorchTitan builds."""
    import dataclasses

    from torchtitan.models.common import ComplexRoPE

    from primus.backends.torchtitan.checkpoint.native import FIXED_SCALING, llama_scaling_defaults

    fields = {f.name: f.default for f in dataclasses.fields(ComplexRoPE.Config)}
    assert llama_scaling_defaults() == {k: float(fields[k]) for k in FIXED_SCALING}


def test_an_export_of_a_run_that_saved_nothing_says_so(tmp_path: Path) -> None:
    """No checkpoint folder yet (the run never trained): a config error, not a traceback."""
    stderr = export_of_nothing(RECIPE, tmp_path)
    assert "checkpoint: no TorchTitan checkpoint" in stderr
    assert "hint: train with checkpoint.enable=true first" in stderr


def test_a_resume_passes_over_the_last_steps_model_only_export(tmp_path: Path) -> None:
    """checkpoint.last_save_model_only (or last_save_in_hf) writes the last step without the
    run's state: TorchTitan picked it to resume from and failed. Real DCP saves: step 3 a
    run's, step 6 the model only, step 9 an HF export's index, step 12 unfinished."""
    import torch.distributed.checkpoint as dcp

    from primus.backends.torchtitan.checkpoint.patches import _resumed_step

    weights = {"tok_embeddings.weight": torch.ones(4, 2)}
    dcp.save(weights | {"train_state": {"step": torch.tensor(3)}},
             checkpoint_id=str(tmp_path / "step-3"), no_dist=True)  # fmt: skip
    dcp.save(weights, checkpoint_id=str(tmp_path / "step-6"), no_dist=True)
    (tmp_path / "step-9").mkdir()
    (tmp_path / "step-9" / "model.safetensors.index.json").write_text("{}")
    (tmp_path / "step-12").mkdir()
    assert _resumed_step(str(tmp_path), 9) == (3, ["step-9", "step-6"])
    assert _resumed_step(str(tmp_path), 3) == (3, [])
    assert _resumed_step(str(tmp_path), -1) == (-1, [])
    (tmp_path / "step-3" / ".metadata").unlink()  # now a save that did not finish
    dcp.save(weights, checkpoint_id=str(tmp_path / "step-0"), no_dist=True)  # a seed checkpoint
    assert _resumed_step(str(tmp_path), 9) == (0, ["step-9", "step-6"])
