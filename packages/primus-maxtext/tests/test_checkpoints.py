"""`primus checkpoint preset`, `inspect` and `export` on MaxText, and `init_from`: a preset
derived from Mixtral 8x7B's published config.json, and one real CPU run that starts from a
tiny HF Llama model (`init_from`), saves orbax checkpoints (a process forked by one that
imported MaxText once, conftest's `forks`), and is exported back to HF."""

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import yaml

from primus.core.checkpoint.hf import read_config
from primus.testing import runs
from primus.testing.checkpoints import derived_preset, inspect_json, resolved_model
from primus.testing.faults import Forks
from primus.testing.forked import forked
from primus.testing.hf_models import HF_CONFIGS, hf_loss, make_hf_model
from primus.testing.runs import losses, primus, train_run

RECIPE = Path(__file__).parents[3] / "configs" / "maxtext" / "tiny-cpu.yaml"
ARCHITECTURE = (
    "decoder_block", "base_emb_dim", "base_num_decoder_layers", "base_num_query_heads",
    "base_num_kv_heads", "head_dim", "base_mlp_dim", "base_moe_mlp_dim", "num_experts",
    "num_experts_per_tok", "vocab_size", "logits_via_embedding", "normalization_layer_epsilon",
    "rope_max_timescale",
)  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mixtral_8x7B", "llama3.2_1B"])
def test_preset_from_hf_config_matches_the_shipped_preset(name: str, tmp_path: Path) -> None:
    derived = derived_preset("maxtext", HF_CONFIGS[name], tmp_path)
    ours = resolved_model("maxtext", "maxtext_pretrain", derived.name, tmp_path)
    shipped = resolved_model("maxtext", "maxtext_pretrain", name, tmp_path)
    # tied logits are HF's only without MaxText's 1/sqrt(emb_dim) on them
    keys = ARCHITECTURE + ("normalize_embedding_logits",) * shipped["logits_via_embedding"]
    assert {k: ours.get(k) for k in keys} == {k: shipped.get(k) for k in keys}
    assert ours.get("load_balance_loss_weight") == shipped.get("load_balance_loss_weight")


RUN = ("exp_name=ckpt", "steps=4", "enable_checkpointing=true", "checkpoint_period=2")


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, forks: Forks) -> tuple[Path, Path, Path]:
    """The tiny recipe with `init_from` an HF Llama of the tiny preset's architecture (default
    RoPE, untied embeddings) in bf16, as published models are (the import keeps bf16, MaxText's
    restore widens it to its float32 weights), with a tokenizer's file: (run dir, HF model,
    experiment)."""
    import torch
    from transformers import AutoModelForCausalLM

    folder = tmp_path_factory.mktemp("ckpt")
    source = make_hf_model(folder / "source", "llama3", intermediate_size=176, rope_scaling=None)
    hf = folder / "hf"
    AutoModelForCausalLM.from_pretrained(source, dtype=torch.bfloat16).save_pretrained(hf)
    (hf / "tokenizer.json").write_text('{"file": "tokenizer.json"}')
    exp = yaml.safe_load(RECIPE.read_text())
    module = exp["modules"]["pre_trainer"]
    module["init_from"] = {"hf": str(hf)}
    module["overrides"]["normalize_embedding_logits"] = False  # the preset from HF says so
    (folder / "exp.yaml").write_text(yaml.safe_dump(exp))
    with forked(forks, runs):
        return train_run(folder / "exp.yaml", folder, *RUN), hf, folder / "exp.yaml"


@pytest.mark.slow
def test_init_from_starts_training_from_the_hf_model(
    run: tuple[Path, Path, Path], synthetic_batch: Callable[[Path], np.ndarray]
) -> None:
    run_dir, hf, _ = run
    assert (run_dir / "hf_import" / "0" / "items").is_dir()
    log = (run_dir / "logs" / "rank-0.log").read_text()
    assert f"restoring params from {run_dir / 'hf_import' / '0'}" in log
    # orbax's "may be malformed" (a checkpoint without OCDBT data) and "failed to resolve
    # handler" (a checkpointable it has no record of) warnings: the import is neither
    assert "TensorStore data files not found" not in log
    assert "Failed to resolve handler" not in log
    assert losses(run_dir)[1] == pytest.approx(hf_loss(hf, synthetic_batch(run_dir)), rel=1e-5)


@pytest.mark.slow
def test_export_of_the_trained_run_gives_its_loss(
    run: tuple[Path, Path, Path], tmp_path: Path, synthetic_batch: Callable[[Path], np.ndarray]
) -> None:
    """In float32 (`export_dtype`, over the bf16 source's dtype: the trained weights as they
    are), with init_from's config.json, tokenizer and generation_config.json."""
    run_dir, hf, exp = run
    out = tmp_path / "hf"
    result = primus("checkpoint", "export", "--config", str(exp), "--iteration", "2",
                    "--hf", str(out), *RUN, "export_dtype=float32",
                    PRIMUS_WORKSPACE=str(exp.parent))  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "float32 tensors (export_dtype set by cli (export_dtype=float32))" in result.stderr
    assert read_config(out) == read_config(hf) | {"dtype": "float32"}
    for name in ("tokenizer.json", "generation_config.json"):
        assert (out / name).read_bytes() == (hf / name).read_bytes()
    # orbax step 2 holds the weights after three updates: the ones step 4's loss was taken on
    assert losses(run_dir)[4] == pytest.approx(hf_loss(out, synthetic_batch(run_dir)), rel=1e-5)


@pytest.mark.slow
def test_inspect_an_orbax_checkpoint_from_a_real_run(run: tuple[Path, Path, Path]) -> None:
    run_dir, _, _ = run
    info = inspect_json(run_dir / "checkpoints")
    # orbax counts steps from 0: 0, 2 and the final 3
    assert (info["backend"], info["iteration"], info["iterations_saved"]) == (
        "maxtext",
        3,
        [0, 2, 3],
    )
    assert info["model"] == {"vocab_size": 256, "emb_dim": 64, "num_decoder_layers": 2,
                             "num_query_heads": 4, "num_kv_heads": 2, "head_dim": 16,
                             "logits_via_embedding": False, "scan_layers": True}  # fmt: skip
    assert info["parallel"] == {"saving_processes": 1}
    assert info["provenance"]["run_dir"] == str(run_dir.resolve())


@pytest.mark.slow
def test_init_from_with_several_processes_asks_for_the_import_first(
    run: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    _, hf, exp = run  # a fresh run directory: nothing imported there yet
    result = primus("train", "pretrain", "--config", str(exp), "--nproc-per-node", "2",
                    "exp_name=two", PRIMUS_WORKSPACE=str(tmp_path))  # fmt: skip
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "MaxText cannot import while 2 processes run" in result.stderr
    assert f"primus checkpoint import --hf {hf}" in result.stderr
    assert not list(tmp_path.rglob("hf_import"))


@pytest.mark.slow
def test_a_resume_with_another_model_is_one_config_error(
    run: tuple[Path, Path, Path], tmp_path: Path, forks: Forks
) -> None:
    """The run's checkpoints (copied) resumed with a third layer: orbax's error, which lists
    every tensor of the state (megabytes), becomes one message, exit 2."""
    import shutil

    run_dir, _, _ = run
    copy = tmp_path / run_dir.relative_to(run_dir.parents[2])
    shutil.copytree(run_dir, copy)
    with forked(forks, runs):
        result = primus("train", "pretrain", "--config", str(RECIPE), *RUN, "steps=6",
                        "base_num_decoder_layers=3", PRIMUS_WORKSPACE=str(tmp_path))  # fmt: skip
    assert result.returncode == 2, result.stderr[-3000:]
    assert f"error: the checkpoint {copy / 'checkpoints'}/3 does not fit this run's model" in (
        result.stderr
    )
    assert "hint: resume with the model it was saved with" in result.stderr
    assert len(result.stderr) < 20_000 and "Traceback" not in result.stderr
    step = copy / "checkpoints" / "3"  # a data file cut short: damaged, not another model
    data = max((step / "items").rglob("d/*"), key=lambda path: path.stat().st_size)
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    with forked(forks, runs):
        result = primus("train", "pretrain", "--config", str(RECIPE), *RUN, "steps=6",
                        PRIMUS_WORKSPACE=str(tmp_path))  # fmt: skip
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert f"error: the checkpoint {step} cannot be read (ValueError: OUT_OF_RANGE: " in (
        result.stderr
    )
    assert f"hint: a file in it may be damaged or cut short: move {step} out of" in result.stderr
